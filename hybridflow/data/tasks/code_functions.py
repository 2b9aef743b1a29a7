"""Built-in task ``code-functions``: write a short Python function; hidden tests check it.

A prompt reads "Write a Python function `add_seven(x)` that returns x plus 7. ..."; the ground
truth holds the function name and test cases in verl's call-based code format
(``{"fn_name", "inputs": [[args], ...], "outputs": [...]}``), scored in the sandbox by
``hybridflow/reward/scorers/code.py``. Problems come from twenty one-line families
(arithmetic on a number, list sums and counts, string reversal and repetition, parity and
divisibility) with random constants, so SmolLM2-135M-Instruct solves some but not most.

``hybridflow data code-convert --src FILE --out DIR`` checks and normalises a verl-style code
parquet/jsonl (rows with ``data_source``, ``prompt`` and ``reward_model.ground_truth`` holding
``inputs`` / ``outputs``, optionally ``fn_name``), writing ``train`` / ``test`` with the ground
truth as a JSON string and every bad row reported by index.
"""

from __future__ import annotations

import argparse
import json
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from hybridflow import fields as F
from hybridflow.data.io import read_rows
from hybridflow.data.schema import PROMPT_KEY
from hybridflow.data.tasks.common import Rows, TaskSpec, add_size_arguments, make_row

DATA_SOURCE = "hybridflow/code-functions"
INSTRUCTION = "Reply with the function in a ```python code block."
NUMBERS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten")


@dataclass(frozen=True)
class Family:
    """One kind of problem: ``make(rng)`` → (name, signature, description, fn, argument lists)."""

    make: Callable[[random.Random], tuple[str, str, str, Callable[..., Any], list[list[Any]]]]


def _ints(rng: random.Random, n: int = 4) -> list[list[int]]:
    return [[rng.randint(-20, 40)] for _ in range(n)]


def _lists(rng: random.Random, n: int = 4) -> list[list[list[int]]]:
    return [[[rng.randint(-5, 9) for _ in range(rng.randint(0, 6))]] for _ in range(n)]


def _words(rng: random.Random, n: int = 4) -> list[list[str]]:
    pool = ["apple", "hello", "code", "river", "stone", "abc", "level", "python", "moon", "x"]
    return [[rng.choice(pool)] for _ in range(n)]


def _add(rng):
    k = rng.randint(2, 10)
    return f"add_{NUMBERS[k]}", "x", f"returns x plus {k}", lambda x: x + k, _ints(rng)


def _times(rng):
    k = rng.randint(2, 9)
    return f"times_{NUMBERS[k]}", "x", f"returns x multiplied by {k}", lambda x: x * k, _ints(rng)


def _minus(rng):
    k = rng.randint(2, 10)
    return f"minus_{NUMBERS[k]}", "x", f"returns x minus {k}", lambda x: x - k, _ints(rng)


def _square(rng):
    return "square", "x", "returns x squared", lambda x: x * x, _ints(rng)


def _larger(rng):
    args = [[rng.randint(-20, 40), rng.randint(-20, 40)] for _ in range(4)]
    return "larger", "a, b", "returns the larger of a and b", max, args


def _smaller(rng):
    args = [[rng.randint(-20, 40), rng.randint(-20, 40)] for _ in range(4)]
    return "smaller", "a, b", "returns the smaller of a and b", min, args


def _is_even(rng):
    return "is_even", "n", "returns True if n is even and False otherwise", lambda n: n % 2 == 0, _ints(rng)


def _divisible(rng):
    k = rng.randint(3, 9)
    return (
        f"divisible_by_{NUMBERS[k]}",
        "n",
        f"returns True if n is divisible by {k} and False otherwise",
        lambda n: n % k == 0,
        [[rng.randint(0, 12) * k + rng.choice([0, 0, 1, 2])] for _ in range(4)],
    )


def _sum_list(rng):
    return "sum_list", "numbers", "returns the sum of the numbers in the list", sum, _lists(rng)


def _count(rng):
    k = rng.randint(0, 9)
    args = [[[rng.choice([k, k, rng.randint(0, 9)]) for _ in range(rng.randint(0, 6))]] for _ in range(4)]
    return (
        f"count_{NUMBERS[k]}s",
        "numbers",
        f"returns how many times {k} appears in the list",
        lambda xs: xs.count(k),
        args,
    )


def _reverse(rng):
    return "reverse", "text", "returns the string reversed", lambda s: s[::-1], _words(rng)


def _repeat(rng):
    k = rng.randint(2, 4)
    return f"repeat_{NUMBERS[k]}", "text", f"returns the string repeated {k} times", lambda s: s * k, _words(rng)


def _length(rng):
    return "length", "text", "returns the number of characters in the string", len, _words(rng)


def _affine(rng):
    a, b = rng.randint(2, 9), rng.randint(1, 9)
    return f"scale_{NUMBERS[a]}_add_{NUMBERS[b]}", "x", f"returns {a} times x plus {b}", lambda x: a * x + b, _ints(rng)


def _sum_evens(rng):
    return (
        "sum_of_evens",
        "numbers",
        "returns the sum of the even numbers in the list",
        lambda xs: sum(x for x in xs if x % 2 == 0),
        _lists(rng),
    )


def _count_vowels(rng):
    return (
        "count_vowels",
        "text",
        "returns how many vowels (a, e, i, o, u) the string contains",
        lambda t: sum(c in "aeiou" for c in t),
        _words(rng),
    )


def _fizz(rng):
    k = rng.randint(3, 7)
    return (
        f"fizz_{NUMBERS[k]}",
        "n",
        f"returns the string 'fizz' if n is divisible by {k}, otherwise n as a string",
        lambda n: "fizz" if n % k == 0 else str(n),
        [[rng.randint(1, 6) * k + rng.choice([0, 1, 2])] for _ in range(4)],
    )


def _largest(rng):
    args = [[[rng.randint(-9, 30) for _ in range(rng.randint(1, 6))]] for _ in range(4)]
    return "largest", "numbers", "returns the largest number in a non-empty list", max, args


def _positives(rng):
    return (
        "count_positive",
        "numbers",
        "returns how many numbers in the list are greater than zero",
        lambda xs: sum(x > 0 for x in xs),
        _lists(rng),
    )


def _digit_sum(rng):
    return (
        "digit_sum",
        "n",
        "returns the sum of the decimal digits of a non-negative integer n",
        lambda n: sum(map(int, str(n))),
        [[rng.randint(0, 9999)] for _ in range(4)],
    )


FAMILIES: tuple[Family, ...] = tuple(
    Family(f)
    for f in (
        _add,
        _times,
        _minus,
        _square,
        _larger,
        _smaller,
        _is_even,
        _divisible,
        _sum_list,
        _count,
        _reverse,
        _repeat,
        _length,
        _affine,
        _sum_evens,
        _count_vowels,
        _fizz,
        _largest,
        _positives,
        _digit_sum,
    )
)


def make_problem(rng: random.Random) -> dict[str, Any]:
    """One problem: ``question`` and ``tests`` (verl's call-based format, outputs computed)."""
    name, signature, description, fn, args = rng.choice(FAMILIES).make(rng)
    question = f"Write a Python function `{name}({signature})` that {description}. {INSTRUCTION}"
    tests = {"fn_name": name, "inputs": args, "outputs": [fn(*a) for a in args]}
    return {"question": question, "tests": tests, "name": name}


def generate_code_functions(num_train: int, num_test: int, *, seed: int = 0) -> tuple[Rows, Rows]:
    """``(train, test)``; test questions (name + description) never occur in train."""
    rng = random.Random(seed)
    test = [make_problem(rng) for _ in range(num_test)]
    seen = {p["question"] for p in test}
    train: list[dict[str, Any]] = []
    while len(train) < num_train:
        problem = make_problem(rng)
        if problem["question"] not in seen:
            train.append(problem)
    return _rows(train, "train"), _rows(test, "test")


def _rows(problems: list[dict[str, Any]], split: str) -> Rows:
    return [
        make_row(
            data_source=DATA_SOURCE,
            question=p["question"],
            ground_truth=json.dumps(p["tests"]),
            split=split,
            index=i,
            ability="code",
            extra={"fn_name": p["name"]},
        )
        for i, p in enumerate(problems)
    ]


def _add_arguments(parser: argparse.ArgumentParser) -> None:
    add_size_arguments(parser, train_size=512, test_size=64)


def _build(args: argparse.Namespace) -> tuple[Rows, Rows]:
    return generate_code_functions(args.train_size, args.test_size, seed=args.seed)


TASK = TaskSpec(
    name="code-functions",
    help="write a one-line Python function; hidden call-based tests run in the sandbox",
    add_arguments=_add_arguments,
    build=_build,
)


# ---- converter for verl-style code data ---------------------------------------------------------


class CodeRowError(ValueError):
    """A code row that cannot be used; the message names the file, row and field."""


def parse_code_tests(ground_truth: Any, what: str = "code ground truth") -> dict[str, Any]:
    """Test cases (a dict or its JSON) checked: equal-length, non-empty ``inputs`` / ``outputs``
    lists and a string ``fn_name`` if any; ``ValueError`` starting with ``what`` otherwise."""
    try:
        tests = json.loads(ground_truth) if isinstance(ground_truth, (str, bytes)) else ground_truth
    except json.JSONDecodeError as exc:
        raise ValueError(f"{what} is not JSON ({exc.msg})") from None
    if (
        not isinstance(tests, dict)
        or not isinstance(tests.get("inputs"), list)
        or not isinstance(tests.get("outputs"), list)
    ):
        raise ValueError(f"{what} needs 'inputs' and 'outputs' lists")
    if len(tests["inputs"]) != len(tests["outputs"]) or not tests["inputs"]:
        raise ValueError(f"{what} has {len(tests['inputs'])} inputs but {len(tests['outputs'])} outputs")
    if "fn_name" in tests and not isinstance(tests["fn_name"], str):
        raise ValueError(f"{what} has an fn_name that is not a string")
    return tests


def convert_code_row(row: dict[str, Any], where: str) -> dict[str, Any]:
    """A verl-style code row, checked, with ``reward_model.ground_truth`` as a JSON string."""
    for key in (F.DATA_SOURCE, PROMPT_KEY, F.REWARD_MODEL):
        if key not in row:
            raise CodeRowError(f"{where}: missing column {key!r}")
    truth = row[F.REWARD_MODEL].get("ground_truth") if isinstance(row[F.REWARD_MODEL], dict) else None
    try:
        tests = parse_code_tests(truth, "reward_model.ground_truth")
    except ValueError as exc:
        raise CodeRowError(f"{where}: {exc}") from None
    reward = {
        **row[F.REWARD_MODEL],
        "ground_truth": json.dumps(tests),
        "style": row[F.REWARD_MODEL].get("style") or "rule",
    }
    return {**row, F.REWARD_MODEL: reward}


def _convert_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--src", required=True, help="verl-style code parquet or jsonl")
    parser.add_argument("--test-fraction", type=float, default=0.1, help="rows held out as test (default 0.1)")
    parser.add_argument("--seed", type=int, default=0, help="split seed (default 0)")


def _convert(args: argparse.Namespace) -> tuple[Rows, Rows]:
    rows = [convert_code_row(row, f"{args.src}: row {i}") for i, row in enumerate(read_rows(args.src))]
    if not 0 <= args.test_fraction < 1:
        raise ValueError(f"--test-fraction must be in [0, 1), got {args.test_fraction}")
    order = list(range(len(rows)))
    random.Random(args.seed).shuffle(order)
    cut = int(round(len(rows) * args.test_fraction))
    return [rows[i] for i in order[cut:]], [rows[i] for i in order[:cut]]


CONVERT_TASK = TaskSpec(
    name="code-convert",
    help="check a verl-style code parquet/jsonl (inputs/outputs test cases) and write train/test",
    add_arguments=_convert_arguments,
    build=_convert,
)
