"""What every built-in task shares: the row builder, the file writer and the task spec.

A task is a :class:`TaskSpec` in the ``TASKS`` registry (``hybridflow/data/tasks/__init__.py``):
its CLI arguments and a function from parsed arguments to ``(train_rows, test_rows)``.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hybridflow import fields as F
from hybridflow.data.io import write_rows
from hybridflow.data.schema import ABILITY, PROMPT_KEY

Rows = list[dict[str, Any]]


@dataclass(frozen=True)
class TaskSpec:
    """A built-in task as the data CLI sees it."""

    name: str
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    build: Callable[[argparse.Namespace], tuple[Rows, Rows]]
    # files beyond train/test (an SFT split, a tool config): (args, out_dir) → paths written
    write_extra: Callable[[argparse.Namespace, Path], list[Path]] | None = None


def make_row(
    *,
    data_source: str,
    question: str,
    ground_truth: Any,
    split: str,
    index: int,
    ability: str,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """One row in verl's RL schema with a single user message."""
    return {
        F.DATA_SOURCE: data_source,
        PROMPT_KEY: [{"role": "user", "content": question}],
        ABILITY: ability,
        F.REWARD_MODEL: {"style": "rule", "ground_truth": ground_truth},
        F.EXTRA_INFO: {"split": split, "index": index, **(extra or {})},
    }


def apply_prompt_template(rows: Rows, template: str) -> Rows:
    """``rows`` with every user message's content put into ``template`` at ``{question}`` — the plain
    prompt format a base model needs (``"Question: {question}\nAnswer:"``); other braces are literal."""
    if template.count("{question}") != 1:
        raise ValueError(f"--prompt-template must contain '{{question}}' exactly once, got {template!r}")
    before, after = template.split("{question}")
    return [
        {
            **row,
            PROMPT_KEY: [
                {**m, "content": before + m["content"] + after} if m.get("role") == "user" else m
                for m in row[PROMPT_KEY]
            ],
        }
        for row in rows
    ]


def write_task(train_rows: Rows, test_rows: Rows, out_dir: str | os.PathLike) -> list[Path]:
    """Write ``train`` / ``test`` as both ``.parquet`` and ``.jsonl`` under ``out_dir``; returns the paths."""
    out = Path(out_dir).expanduser()
    written = []
    for split, rows in (("train", train_rows), ("test", test_rows)):
        for suffix in (".parquet", ".jsonl"):
            written.append(write_rows(rows, out / f"{split}{suffix}"))
    return written


def add_size_arguments(parser: argparse.ArgumentParser, *, train_size: int, test_size: int) -> None:
    """``--train-size``, ``--test-size`` and ``--seed`` for generated tasks."""
    parser.add_argument("--train-size", type=int, default=train_size, help=f"training rows (default {train_size})")
    parser.add_argument("--test-size", type=int, default=test_size, help=f"held-out rows (default {test_size})")
    parser.add_argument("--seed", type=int, default=0, help="generator seed (default 0)")
