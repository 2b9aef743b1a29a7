"""Fixtures for the data tests: the tiny ChatML tokenizer and a row writer."""

from __future__ import annotations

import json
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def tokenizer():
    from hybridflow.models.tiny import build_tiny_tokenizer

    return build_tiny_tokenizer()


def rl_row(question: str, answer: str = "1", index: int | None = None, source: str = "hybridflow/arithmetic") -> dict:
    extra = {"split": "train"} if index is None else {"split": "train", "index": index}
    return {
        "data_source": source,
        "prompt": [{"role": "user", "content": question}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": answer},
        "extra_info": extra,
    }


@pytest.fixture
def write_jsonl(tmp_path: Path):
    """``write_jsonl(name, rows)`` → path of a JSON-lines file under tmp_path (rows written as given)."""

    def write(name: str, rows: list) -> Path:
        path = tmp_path / name
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        return path

    return write


@pytest.fixture
def make_row():
    return rl_row
