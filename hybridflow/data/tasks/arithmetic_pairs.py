"""Built-in task ``arithmetic-pairs``: preference pairs on the arithmetic problems, for ``hybridflow rm``.

Prompts are the ``arithmetic`` task's — same arguments, same distribution, same chat message
(``"What is 23 + 45? Write the final answer as an integer after '####'."``) — so a reward model
trained here judges the RL task's responses. They are drawn from another random stream
(the seed is hashed with this task's name), and the held-out test problems of ``arithmetic``
with the same settings and ``--seed`` (its first ``--exclude-test-size`` = 200, its default
test size) are left out of the training split: an RM trained here never saw the problems an
RL run is evaluated on.

Each row: ``prompt`` (chat messages), ``chosen`` (a correct answer), ``rejected`` (a plausible
wrong one: off by one or ten, two digits swapped, a carry or borrow dropped, or another
operation's result), ``data_source`` (the arithmetic scorer's) and ``ground_truth``. Both
replies of a pair use the same response style, so only correctness tells them apart. The
styles imitate what SmolLM2-135M-Instruct writes for this prompt — a working line
``"23 + 45 = 68"``, a sentence ``"The answer is 68."``, with or without ``"#### 68"`` — and are
drawn uniformly. Everything is deterministic given ``--seed``.
"""

from __future__ import annotations

import argparse
import hashlib
import random
from collections.abc import Callable

from hybridflow import fields as F
from hybridflow.data.tasks.arithmetic import TASK as ARITHMETIC_TASK
from hybridflow.data.tasks.common import Rows, TaskSpec
from hybridflow.data.tasks.expr import evaluate_expression

GROUND_TRUTH = "ground_truth"
DEFAULT_EXCLUDED_TEST = 200  # the arithmetic task's default --test-size
PAIR_SIZES = {"train_size": 1000, "test_size": 200}  # an RM needs more pairs than RL needs prompts

# style name → the reply for (expression, answer); the no-"####" styles end with the answer,
# the number the lenient arithmetic scorer falls back to
STYLES: dict[str, Callable[[str, str], str]] = {
    "worked": lambda e, a: f"{e} = {a}\n#### {a}",
    "sentence": lambda e, a: f"The answer is {a}.\n#### {a}",
    "worked_sentence": lambda e, a: f"{e} = {a}\n\nThe answer is {a}.\n#### {a}",
    "equation": lambda e, a: f"{e} = {a}.",
    "final": lambda e, a: f"The final answer is {a}.",
    "steps": lambda e, a: f"To find {e}, we work it out: the result is {a}, so the answer is {a}.",
}
OPERATORS: tuple[str, ...] = ("+", "-", "*")


def stream_seed(seed: int, purpose: str) -> int:
    """A 64-bit seed for ``purpose`` of this task: streams unrelated to ``random.Random(seed)``."""
    digest = hashlib.sha256(f"arithmetic-pairs/{purpose}/{seed}".encode()).digest()
    return int.from_bytes(digest[:8], "big")


def _swapped_digits(answer: int) -> list[int]:
    digits = str(abs(answer))
    if len(digits) < 2 or digits[-1] == digits[-2]:
        return []
    swapped = int(digits[:-2] + digits[-1] + digits[-2])
    return [-swapped if answer < 0 else swapped]


def _dropped_carry(expression: str) -> list[int]:
    """``a + b`` added digit by digit without carries; ``a - b`` (a ≥ b) without borrows."""
    parts = expression.split()
    if len(parts) != 3 or parts[1] not in "+-":
        return []
    a, op, b = int(parts[0]), parts[1], int(parts[2])
    if op == "-" and a < b:
        return []
    width = len(str(max(a, b)))
    da, db = str(a).zfill(width), str(b).zfill(width)
    combine = (lambda x, y: (x + y) % 10) if op == "+" else (lambda x, y: abs(x - y))
    return [int("".join(str(combine(int(x), int(y))) for x, y in zip(da, db)))]


def _wrong_operation(expression: str) -> list[int]:
    parts = expression.split()
    values = []
    for i in range(1, len(parts), 2):
        for op in OPERATORS:
            if op != parts[i]:
                values.append(int(evaluate_expression(" ".join(parts[:i] + [op] + parts[i + 1 :]))))
    return values


def wrong_answers(expression: str, answer: int) -> dict[str, list[int]]:
    """Plausible mistakes for ``expression`` by kind, each value ≠ ``answer``; kinds that give
    no different value (no carry to drop, equal last digits) are left out."""
    candidates = {
        "off_by_one": [answer - 1, answer + 1],
        "off_by_ten": [answer - 10, answer + 10],
        "swapped_digits": _swapped_digits(answer),
        "dropped_carry": _dropped_carry(expression),
        "wrong_operation": _wrong_operation(expression),
    }
    kinds = {kind: sorted({v for v in values if v != answer}) for kind, values in candidates.items()}
    return {kind: values for kind, values in kinds.items() if values}


def make_pair(rng: random.Random, expression: str, answer: int) -> tuple[str, str, str, str]:
    """``(chosen, rejected, style, error kind)`` for one problem."""
    style = rng.choice(sorted(STYLES))
    mistakes = wrong_answers(expression, answer)
    kind = rng.choice(sorted(mistakes))
    wrong = rng.choice(mistakes[kind])
    render = STYLES[style]
    return render(expression, str(answer)), render(expression, str(wrong)), style, kind


def pair_rows(rows: Rows, rng: random.Random) -> Rows:
    """Arithmetic RL rows → preference-pair rows (same prompt, data source and extra_info, plus
    the pair's style and error kind)."""
    out = []
    for row in rows:
        extra = row[F.EXTRA_INFO]
        chosen, rejected, style, kind = make_pair(rng, extra["expression"], int(extra["answer"]))
        out.append(
            {
                F.DATA_SOURCE: row[F.DATA_SOURCE],
                "prompt": row["prompt"],
                "chosen": chosen,
                "rejected": rejected,
                GROUND_TRUTH: row[F.REWARD_MODEL]["ground_truth"],
                F.EXTRA_INFO: {**extra, "style": style, "error": kind},
            }
        )
    return out


def _arithmetic_rows(args: argparse.Namespace, **changes: int) -> tuple[Rows, Rows]:
    return ARITHMETIC_TASK.build(argparse.Namespace(**{**vars(args), **changes}))


def _excluded_problems(args: argparse.Namespace) -> set[str]:
    try:
        _, held_out = _arithmetic_rows(args, train_size=0, test_size=args.exclude_test_size)
    except ValueError as err:
        raise ValueError(
            f"cannot draw the {args.exclude_test_size} `arithmetic` test problems to leave out ({err}); set "
            "--exclude-test-size to the --test-size given to `hybridflow data arithmetic` (0: leave none out)"
        ) from None
    return {row[F.EXTRA_INFO]["expression"] for row in held_out}


def _build(args: argparse.Namespace) -> tuple[Rows, Rows]:
    if args.exclude_test_size < 0:
        raise ValueError(f"--exclude-test-size must be ≥ 0, got {args.exclude_test_size}")
    excluded = _excluded_problems(args)
    seed = stream_seed(args.seed, "problems")
    # The arithmetic generator draws problems one after another, so asking for more training
    # rows extends the same sequence: draw until enough of them are not excluded.
    drawn = args.train_size
    while True:
        pool, test = _arithmetic_rows(args, seed=seed, train_size=drawn)
        train = [row for row in pool if row[F.EXTRA_INFO]["expression"] not in excluded][: args.train_size]
        if len(train) == args.train_size:
            break
        drawn += args.train_size - len(train)
    for split, rows in (("train", train), ("test", test)):
        for i, row in enumerate(rows):
            row[F.EXTRA_INFO] = {**row[F.EXTRA_INFO], "split": split, "index": i}
    rng = random.Random(stream_seed(args.seed, "replies"))
    return pair_rows(train, rng), pair_rows(test, rng)


def _add_arguments(parser: argparse.ArgumentParser) -> None:
    ARITHMETIC_TASK.add_arguments(parser)
    # argparse has no public way to change an added argument's help, which names its default
    for action in parser._actions:
        if action.dest in PAIR_SIZES:
            help_text = action.help
            assert help_text is not None  # every `arithmetic` argument has a help text
            action.default = PAIR_SIZES[action.dest]
            action.help = f"{help_text.split(' (default')[0]} (default {action.default})"
    parser.add_argument(
        "--exclude-test-size",
        type=int,
        default=DEFAULT_EXCLUDED_TEST,
        help="leave out of the training split the first N test problems of `arithmetic` with the same "
        f"settings and --seed (default {DEFAULT_EXCLUDED_TEST}, its default test size)",
    )


TASK = TaskSpec(
    name="arithmetic-pairs",
    help="the arithmetic prompts with a correct (chosen) and a plausible wrong (rejected) answer, for `hybridflow rm`",
    add_arguments=_add_arguments,
    build=_build,
)
