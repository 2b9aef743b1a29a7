"""Built-in task ``countdown``: reach a target with given numbers and ``+ - * /``.

Each problem is built from a random equation over ``num_numbers`` numbers (every
intermediate value a non-negative integer), so every problem has a solution; the
ground truth is ``{"target": int, "numbers": [int, ...]}`` and ``extra_info.solution``
holds one equation that reaches it. The scorer checks the model's equation itself.

Scoring (:func:`compute_score`, the reward of ``hybridflow/countdown`` rows): the equation is the
text after the last ``####`` up to the end of that line, or else the content of the last
``<answer>...</answer>``; anything from an ``=`` on is dropped (``"(1 + 2) * 3 = 9"`` →
``"(1 + 2) * 3"``). Scores:

* 1.0 — it uses exactly the given numbers, each once (as a multiset), contains only integers,
  ``+ - * /`` and parentheses, and evaluates exactly to the target;
* ``format_score`` (0.1) — an equation was found but fails any of those checks;
* 0.0 — no equation found.

``ground_truth`` is ``{"target": int, "numbers": [int, ...]}``; anything else raises (and the
reward manager scores the item 0 and counts an error).
"""

from __future__ import annotations

import argparse
import random
import re
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from hybridflow.data.tasks.common import Rows, TaskSpec, add_size_arguments, make_row
from hybridflow.data.tasks.expr import (
    ExpressionError,
    evaluate_expression,
    expression_numbers,
)

DATA_SOURCE = "hybridflow/countdown"
DEFAULT_INSTRUCTION = (
    "Use each number exactly once with + - * / and parentheses. "
    "Write the equation after '####', for example '#### (1 + 2) * 3'."
)


@dataclass(frozen=True)
class CountdownSettings:
    num_numbers: int = 3
    min_number: int = 1
    max_number: int = 99
    min_target: int = 1
    max_target: int = 100
    instruction: str = DEFAULT_INSTRUCTION

    def __post_init__(self) -> None:
        if not 2 <= self.num_numbers <= 6:
            raise ValueError(f"num_numbers must be in 2..6, got {self.num_numbers}")
        if not 1 <= self.min_number <= self.max_number:
            raise ValueError(f"need 1 <= min_number <= max_number, got {self.min_number}..{self.max_number}")
        if not 0 <= self.min_target <= self.max_target:
            raise ValueError(f"need 0 <= min_target <= max_target, got {self.min_target}..{self.max_target}")


def make_problem(rng: random.Random, settings: CountdownSettings) -> tuple[list[int], int, str]:
    """``(numbers, target, solution)`` with ``solution`` an equation using each number once."""
    for _ in range(10_000):
        numbers = [rng.randint(settings.min_number, settings.max_number) for _ in range(settings.num_numbers)]
        built = _random_equation(rng, numbers)
        if built is None:
            continue
        text, value = built
        if value.denominator == 1 and settings.min_target <= value <= settings.max_target:
            return numbers, int(value), text
    raise ValueError(f"could not build a countdown problem for {settings}; widen the target range")


def _random_equation(rng: random.Random, numbers: list[int]) -> tuple[str, Fraction] | None:
    """Combine random pairs until one term is left; None if a step is not a non-negative integer."""
    terms: list[tuple[str, Fraction]] = [(str(n), Fraction(n)) for n in numbers]
    while len(terms) > 1:
        i, j = rng.sample(range(len(terms)), 2)
        (a_text, a), (b_text, b) = terms[i], terms[j]
        op = rng.choice("+-*/")
        if op == "/" and (b == 0 or a % b != 0):
            return None
        value = {"+": a + b, "-": a - b, "*": a * b, "/": a / b if b else Fraction(0)}[op]
        if value < 0:
            return None
        terms = [t for k, t in enumerate(terms) if k not in (i, j)] + [(f"({a_text} {op} {b_text})", value)]
    text, value = terms[0]
    return (text[1:-1] if text.startswith("(") else text), value


def generate_countdown(
    num_train: int, num_test: int, *, seed: int = 0, settings: CountdownSettings = CountdownSettings()
) -> tuple[Rows, Rows]:
    """``(train_rows, test_rows)``; a (numbers, target) pair never appears in both splits."""
    rng = random.Random(seed)
    taken: set[tuple[tuple[int, ...], int]] = set()
    splits = []
    for split, count in (("test", num_test), ("train", num_train)):
        rows: Rows = []
        attempts = 0
        while len(rows) < count:
            attempts += 1
            if attempts > 50 * count + 1000:
                raise ValueError(f"found only {len(rows)} of {count} distinct countdown problems for {settings}")
            numbers, target, solution = make_problem(rng, settings)
            key = (tuple(sorted(numbers)), target)
            if key in taken:
                continue
            taken.add(key)
            rows.append(_row(numbers, target, solution, split, len(rows), settings))
        splits.append(rows)
    test, train = splits
    return train, test


def _row(numbers: list[int], target: int, solution: str, split: str, index: int, settings: CountdownSettings) -> dict:
    question = f"Using the numbers {numbers}, create an equation that equals {target}. {settings.instruction}"
    return make_row(
        data_source=DATA_SOURCE,
        question=question.strip(),
        ground_truth={"target": target, "numbers": numbers},
        split=split,
        index=index,
        ability="countdown",
        extra={"solution": solution},
    )


def _add_arguments(parser: argparse.ArgumentParser) -> None:
    add_size_arguments(parser, train_size=2000, test_size=200)
    parser.add_argument("--num-numbers", type=int, default=3, help="numbers per problem (default 3)")
    parser.add_argument("--max-number", type=int, default=99, help="largest given number (default 99)")
    parser.add_argument("--max-target", type=int, default=100, help="largest target (default 100)")
    parser.add_argument("--instruction", default=DEFAULT_INSTRUCTION, help="text appended to every question")


def _build(args: argparse.Namespace) -> tuple[Rows, Rows]:
    settings = CountdownSettings(
        num_numbers=args.num_numbers,
        max_number=args.max_number,
        max_target=args.max_target,
        instruction=args.instruction,
    )
    return generate_countdown(args.train_size, args.test_size, seed=args.seed, settings=settings)


TASK = TaskSpec(
    name="countdown",
    help="reach a target number with the given numbers; the scorer checks the equation",
    add_arguments=_add_arguments,
    build=_build,
)


# --- scoring: the reward of DATA_SOURCE rows (registered in hybridflow/reward/scorers/__init__.py) ---
_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


def extract_equation(solution_str: str) -> str | None:
    """The candidate equation per the rule above, or None."""
    if "####" in solution_str:
        equation = solution_str.rsplit("####", 1)[1].strip().split("\n", 1)[0]
    else:
        tags = _ANSWER_TAG.findall(solution_str)
        if not tags:
            return None
        equation = tags[-1]
    equation = equation.split("=", 1)[0].strip()
    return equation or None


def _check_ground_truth(ground_truth: Any) -> tuple[int, list[int]]:
    if not isinstance(ground_truth, dict) or "target" not in ground_truth or "numbers" not in ground_truth:
        raise ValueError(f"countdown ground_truth must be {{'target': int, 'numbers': [int]}}, got {ground_truth!r}")
    return int(ground_truth["target"]), [int(n) for n in ground_truth["numbers"]]


def compute_score(
    solution_str: str, ground_truth: Any, extra_info: dict | None = None, *, format_score: float = 0.1
) -> dict[str, float | str]:
    """``{"score", "acc", "formatted", "pred"}`` per the rule above (``acc`` is 1.0 only when
    correct; ``pred`` the extracted equation, "" if none)."""
    target, numbers = _check_ground_truth(ground_truth)
    equation = extract_equation(solution_str)
    if equation is None:
        return {"score": 0.0, "acc": 0.0, "formatted": 0.0, "pred": ""}
    correct = False
    if sorted(expression_numbers(equation)) == sorted(numbers):
        try:
            correct = evaluate_expression(equation) == target
        except ExpressionError:
            correct = False
    return {
        "score": 1.0 if correct else format_score,
        "acc": 1.0 if correct else 0.0,
        "formatted": 1.0,
        "pred": equation,
    }
