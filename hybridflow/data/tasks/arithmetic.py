"""Built-in task ``arithmetic``: integer add / subtract / multiply with a difficulty knob.

A prompt reads ``"What is 23 + 45? <instruction>"``; the ground truth is the integer answer
as a string (``"68"``). Difficulty is set by the operand range (``min_value``..``max_value``,
or ``digits``), the operators and the number of operands: 2-digit additions put
SmolLM2-135M-Instruct at roughly 25% greedy accuracy, 1-digit ones near the ceiling,
3-digit multiplications near zero. Test problems never appear in the training split.

Scoring (:func:`compute_score`, the reward of ``hybridflow/arithmetic`` rows) — what scores 1.0,
exactly: the response's *final answer* equals the ground-truth integer as a number (``68``,
``68.0`` and ``#### 68`` all match ``"68"``), where the final answer is

1. the number right after the last ``####`` that is followed by a number, if there is one;
2. otherwise (lenient, the default) the last number anywhere in the response;
   with ``strict=True`` a response without ``#### <number>`` scores 0.

Everything else scores 0.0. The returned dict also carries ``acc`` (same as ``score``) and
``formatted`` (1.0 if the answer came from a ``####`` marker), so the logs show whether the
model learned the format as well as the arithmetic.
"""

from __future__ import annotations

import argparse
import random
from dataclasses import dataclass
from typing import Any

from hybridflow.data.tasks.answers import last_number, marked_answer, same_number
from hybridflow.data.tasks.common import Rows, TaskSpec, add_size_arguments, make_row
from hybridflow.data.tasks.expr import evaluate_expression

DATA_SOURCE = "hybridflow/arithmetic"
OPERATORS: tuple[str, ...] = ("+", "-", "*")
DEFAULT_INSTRUCTION = "Write the final answer as an integer after '####'."


@dataclass(frozen=True)
class ArithmeticSettings:
    """Problem distribution. Operands are drawn uniformly from ``[min_value, max_value]``."""

    min_value: int = 10
    max_value: int = 99
    ops: tuple[str, ...] = ("+",)
    num_operands: int = 2
    allow_negative: bool = True  # False: subtraction never yields a negative answer
    instruction: str = DEFAULT_INSTRUCTION

    def __post_init__(self) -> None:
        if self.min_value < 0 or self.max_value < self.min_value:
            raise ValueError(f"need 0 <= min_value <= max_value, got {self.min_value}..{self.max_value}")
        if not self.ops or any(op not in OPERATORS for op in self.ops):
            raise ValueError(f"ops must be a non-empty selection of {OPERATORS}, got {self.ops!r}")
        if self.num_operands < 2:
            raise ValueError(f"num_operands must be at least 2, got {self.num_operands}")


def digits_range(digits: int) -> tuple[int, int]:
    """Operand range of ``digits``-digit numbers: 1 → (0, 9), 2 → (10, 99), 3 → (100, 999)."""
    if digits < 1:
        raise ValueError(f"digits must be at least 1, got {digits}")
    return (0 if digits == 1 else 10 ** (digits - 1), 10**digits - 1)


def make_problem(rng: random.Random, settings: ArithmeticSettings) -> tuple[str, int]:
    """One ``(expression, answer)``, e.g. ``("23 + 45", 68)``; usual precedence (``*`` first)."""
    while True:
        operands = [rng.randint(settings.min_value, settings.max_value) for _ in range(settings.num_operands)]
        ops = [rng.choice(settings.ops) for _ in range(settings.num_operands - 1)]
        if not settings.allow_negative and settings.num_operands == 2 and ops[0] == "-":
            operands.sort(reverse=True)
        expression = " ".join([str(operands[0])] + [f"{op} {n}" for op, n in zip(ops, operands[1:])])
        answer = evaluate_expression(expression)
        if settings.allow_negative or answer >= 0:
            return expression, int(answer)


def _distinct_problems(
    rng: random.Random, settings: ArithmeticSettings, count: int, taken: set[str]
) -> list[tuple[str, int]]:
    problems: list[tuple[str, int]] = []
    attempts = 0
    while len(problems) < count:
        attempts += 1
        if attempts > 50 * count + 1000:
            raise ValueError(
                f"found only {len(problems)} of {count} distinct problems for {settings}; "
                "widen the operand range or ask for fewer rows"
            )
        expression, answer = make_problem(rng, settings)
        if expression not in taken:
            taken.add(expression)
            problems.append((expression, answer))
    return problems


def generate_arithmetic(
    num_train: int, num_test: int, *, seed: int = 0, settings: ArithmeticSettings = ArithmeticSettings()
) -> tuple[Rows, Rows]:
    """``(train_rows, test_rows)`` of distinct problems; no test expression occurs in train."""
    rng = random.Random(seed)
    taken: set[str] = set()
    test = _distinct_problems(rng, settings, num_test, taken)
    train = _distinct_problems(rng, settings, num_train, taken)
    return _rows(train, "train", settings), _rows(test, "test", settings)


def _rows(problems: list[tuple[str, int]], split: str, settings: ArithmeticSettings) -> Rows:
    return [
        make_row(
            data_source=DATA_SOURCE,
            question=f"What is {expression}? {settings.instruction}".strip(),
            ground_truth=str(answer),
            split=split,
            index=i,
            ability="arithmetic",
            extra={"expression": expression, "answer": str(answer)},
        )
        for i, (expression, answer) in enumerate(problems)
    ]


def _add_arguments(parser: argparse.ArgumentParser) -> None:
    # 96 training problems = 24 steps of 4 prompts: the embedded CPU demo's one epoch
    add_size_arguments(parser, train_size=96, test_size=200)
    parser.add_argument("--digits", type=int, default=2, help="operand digits (default 2: 10..99)")
    parser.add_argument("--min-value", type=int, default=None, help="smallest operand (overrides --digits)")
    parser.add_argument("--max-value", type=int, default=None, help="largest operand (overrides --digits)")
    parser.add_argument("--ops", default="+", help="operators to draw from, e.g. '+-*' (default '+')")
    parser.add_argument("--num-operands", type=int, default=2, help="operands per problem (default 2)")
    parser.add_argument("--no-negative", action="store_true", help="never produce a negative answer")
    parser.add_argument("--instruction", default=DEFAULT_INSTRUCTION, help="text appended to every question")


def _build(args: argparse.Namespace) -> tuple[Rows, Rows]:
    low, high = digits_range(args.digits)
    settings = ArithmeticSettings(
        min_value=low if args.min_value is None else args.min_value,
        max_value=high if args.max_value is None else args.max_value,
        ops=tuple(args.ops),
        num_operands=args.num_operands,
        allow_negative=not args.no_negative,
        instruction=args.instruction,
    )
    return generate_arithmetic(args.train_size, args.test_size, seed=args.seed, settings=settings)


TASK = TaskSpec(
    name="arithmetic",
    help="integer add/subtract/multiply problems, answer after '####'",
    add_arguments=_add_arguments,
    build=_build,
)


# --- scoring: the reward of DATA_SOURCE rows (registered in hybridflow/reward/scorers/__init__.py) ---
def extract_answer(solution_str: str, strict: bool = False) -> tuple[str | None, bool]:
    """``(answer, formatted)``: the ``####`` answer if present, else the last number unless ``strict``."""
    marked = marked_answer(solution_str)
    if marked is not None:
        return marked, True
    return (None if strict else last_number(solution_str)), False


def compute_score(
    solution_str: str, ground_truth: Any, extra_info: dict | None = None, *, strict: bool = False
) -> dict[str, float | str]:
    """``{"score": 1.0 | 0.0, "acc": same, "formatted": 1.0 | 0.0, "pred": the answer or ""}`` per
    the rule above (``pred`` is what maj@N votes on)."""
    answer, formatted = extract_answer(solution_str, strict)
    correct = 1.0 if same_number(answer, ground_truth) else 0.0
    return {"score": correct, "acc": correct, "formatted": 1.0 if formatted else 0.0, "pred": answer or ""}
