"""GSM8K converter: a user's local ``openai/gsm8k`` files → verl-schema RL rows.

Nothing is downloaded. The source files are the dataset's own: parquet (the Hugging Face
layout ``main/train-00000-of-00001.parquet``) or JSON lines (``train.jsonl``), each row
``{"question": str, "answer": str}`` where the answer's reasoning ends in ``#### <number>``.
The ground truth is that number with thousands separators removed (``"1,200"`` → ``"1200"``).

Scoring (:func:`compute_score`, the reward of ``openai/gsm8k`` rows): only the last 300
characters of the response are read (the final answer is at the end; this also bounds the work
on runaway generations).

* ``strict`` (the default): the answer is the number after the last ``####`` (a ``$`` and
  thousands commas are allowed: ``#### $1,200``). No ``####`` with a number → ``format_score``.
* ``flexible``: the answer is the last number anywhere in those 300 characters.

The answer scores ``score`` (1.0) if it equals the ground truth as a number, else ``format_score`` (0.0).
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from hybridflow.data.io import read_rows
from hybridflow.data.schema import DataRowError
from hybridflow.data.tasks.answers import last_number, marked_answer, same_number
from hybridflow.data.tasks.common import Rows, TaskSpec, make_row

DATA_SOURCE = "openai/gsm8k"
DEFAULT_INSTRUCTION = 'Solve it step by step, then write the final answer after "####".'
SPLITS: tuple[str, ...] = ("train", "test")


def extract_gsm8k_answer(answer: str) -> str:
    """The number after the last ``####`` of a GSM8K answer, commas removed; ``ValueError`` if absent."""
    if "####" not in answer:
        raise ValueError("no '####' marker in the answer")
    final = answer.rsplit("####", 1)[1].strip().replace(",", "")
    if not final:
        raise ValueError("nothing after the '####' marker")
    return final


def convert_gsm8k_rows(
    source_rows: list[dict[str, Any]], *, split: str, file: str, instruction: str = DEFAULT_INSTRUCTION
) -> Rows:
    """Convert rows of one source file; a bad row raises :class:`DataRowError` naming file, row and field."""
    rows = []
    for i, source in enumerate(source_rows):
        for key in ("question", "answer"):
            if key not in source:
                raise DataRowError(file, i, key, "missing column")
            if not isinstance(source[key], str) or not source[key].strip():
                raise DataRowError(file, i, key, f"expected a non-empty string, got {source[key]!r}")
        try:
            ground_truth = extract_gsm8k_answer(source["answer"])
        except ValueError as exc:
            raise DataRowError(file, i, "answer", str(exc)) from None
        rows.append(
            make_row(
                data_source=DATA_SOURCE,
                question=f"{source['question'].strip()} {instruction}".strip(),
                ground_truth=ground_truth,
                split=split,
                index=i,
                ability="math",
                extra={"question": source["question"], "answer": source["answer"]},
            )
        )
    return rows


def find_split_file(src: str | os.PathLike, split: str) -> Path:
    """The source file of ``split`` under folder ``src`` (``{split}.jsonl``, ``{split}.parquet``,
    or the Hugging Face ``**/{split}-*.parquet``); exactly one must match."""
    root = Path(src)
    if not root.is_dir():
        raise FileNotFoundError(f"GSM8K source folder {root} does not exist")
    for pattern in (f"{split}.jsonl", f"{split}.parquet", f"**/{split}-*.parquet", f"**/{split}.jsonl"):
        matches = sorted(root.glob(pattern))
        if len(matches) == 1:
            return matches[0]
        if len(matches) > 1:
            raise ValueError(f"several GSM8K {split} files under {root}: {[str(m) for m in matches]}; pass --{split}")
    raise FileNotFoundError(
        f"no GSM8K {split} file under {root} (looked for {split}.jsonl, {split}.parquet, **/{split}-*.parquet)"
    )


def convert_gsm8k(
    train_file: str | os.PathLike, test_file: str | os.PathLike, instruction: str = DEFAULT_INSTRUCTION
) -> tuple[Rows, Rows]:
    """Read both source files and convert them: ``(train_rows, test_rows)``."""
    converted = [
        convert_gsm8k_rows(read_rows(path), split=split, file=os.fspath(path), instruction=instruction)
        for split, path in (("train", train_file), ("test", test_file))
    ]
    return converted[0], converted[1]


def _add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--src", default=None, help="folder holding the GSM8K train/test files")
    parser.add_argument("--train", default=None, help="the GSM8K train file (parquet or jsonl)")
    parser.add_argument("--test", default=None, help="the GSM8K test file (parquet or jsonl)")
    parser.add_argument("--instruction", default=DEFAULT_INSTRUCTION, help="text appended to every question")


def _build(args: argparse.Namespace) -> tuple[Rows, Rows]:
    files = {}
    for split in SPLITS:
        given = getattr(args, split)
        if given is None and args.src is None:
            raise ValueError(f"gsm8k needs --src DIR or both --train and --test files (no --{split} given)")
        files[split] = given if given is not None else find_split_file(args.src, split)
    return convert_gsm8k(files["train"], files["test"], instruction=args.instruction)


TASK = TaskSpec(
    name="gsm8k",
    help="convert local openai/gsm8k files (no download) into RL rows",
    add_arguments=_add_arguments,
    build=_build,
)


# --- scoring: the reward of DATA_SOURCE rows (registered in hybridflow/reward/scorers/__init__.py) ---
TAIL_CHARS = 300
METHODS: tuple[str, ...] = ("strict", "flexible")


def extract_solution(solution_str: str, method: str = "strict") -> str | None:
    """The answer string per ``method`` (see the module docstring), or None if there is none."""
    if method not in METHODS:
        raise ValueError(f"unknown GSM8K extraction method {method!r}; valid: {', '.join(METHODS)}")
    tail = solution_str[-TAIL_CHARS:]
    return marked_answer(tail) if method == "strict" else last_number(tail)


def compute_score(
    solution_str: str,
    ground_truth: Any,
    extra_info: dict | None = None,
    *,
    method: str = "strict",
    format_score: float = 0.0,
    score: float = 1.0,
) -> dict[str, Any]:
    """``{"score", "acc", "pred"}``: ``score`` if the extracted answer equals ``ground_truth``
    numerically, else ``format_score``; ``acc`` 1.0/0.0; ``pred`` the extracted answer ("" if none),
    which maj@N votes on."""
    answer = extract_solution(solution_str, method)
    correct = same_number(answer, ground_truth)
    return {"score": score if correct else format_score, "acc": float(correct), "pred": answer or ""}
