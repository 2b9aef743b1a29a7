"""Every built-in task's reference answers score 1 under default_compute_score, wrong ones 0."""

from __future__ import annotations

from hybridflow.data.tasks import (
    ArithmeticSettings,
    generate_arithmetic,
    generate_countdown,
)
from hybridflow.data.tasks.gsm8k import convert_gsm8k_rows
from hybridflow.reward import default_compute_score


def _score(row, text):
    result = default_compute_score(row["data_source"], text, row["reward_model"]["ground_truth"], row["extra_info"])
    return result["score"] if isinstance(result, dict) else result


def test_arithmetic_reference_answers():
    train, test = generate_arithmetic(20, 5, seed=0, settings=ArithmeticSettings(ops=("+", "-", "*")))
    for row in train + test:
        answer = row["extra_info"]["answer"]
        assert _score(row, f"{row['extra_info']['expression']} = {answer}\n#### {answer}") == 1.0
        assert _score(row, f"#### {int(answer) + 1}") == 0.0


def test_countdown_reference_solutions():
    train, _ = generate_countdown(20, 0, seed=1)
    for row in train:
        assert _score(row, f"Let me try.\n#### {row['extra_info']['solution']}") == 1.0
        assert _score(row, "I give up") == 0.0


def test_gsm8k_converted_rows():
    rows = convert_gsm8k_rows([{"question": "q", "answer": "work\n#### 1,024"}], split="test", file="t.jsonl")
    assert _score(rows[0], "... so 1024 in total.\n#### 1,024") == 1.0
    assert _score(rows[0], "1024") == 0.0  # strict: no marker
