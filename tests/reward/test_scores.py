"""Generic scorers (MATH's boxed answers) and ``default_compute_score``'s data_source routing."""

from __future__ import annotations

import pytest

from hybridflow.reward import (
    SCORERS,
    default_compute_score,
    default_compute_score_batch,
)
from hybridflow.reward.scorers import boxed


@pytest.mark.parametrize(
    "text, truth, score",
    [
        (r"so \boxed{\dfrac{1}{2}}", r"\frac12", 1.0),
        (r"\boxed{1/2}", r"\frac{1}{2}", 1.0),
        (r"\boxed{0.5}", ".5", 1.0),
        (r"first \boxed{3} then \boxed{x = 4}", "4", 1.0),
        (r"\boxed{\text{(B)}}", "(B)", 1.0),
        (r"\boxed{90^\circ}", "90", 1.0),
        (r"\boxed{5}", r"\boxed{5}", 1.0),
        (r"\fbox{7}", "7", 1.0),
        (r"The answer is \boxed 9$.", "9", 1.0),
        (r"\boxed{3}", "4", 0.0),
        ("no box 4", "4", 0.0),
        (r"\boxed{unbalanced", "x", 0.0),
    ],
)
def test_boxed(text, truth, score):
    assert boxed.compute_score(text, truth) == score


def test_default_compute_score_dispatch():
    assert default_compute_score("openai/gsm8k", "#### 3", "3") == {"score": 1.0, "acc": 1.0, "pred": "3"}
    assert default_compute_score("lighteval/MATH", r"\boxed{3}", "3") == {"score": 1.0, "acc": 1.0, "pred": "3"}
    assert default_compute_score("math_dapo", "...\nAnswer: 3", "3") == {"score": 1.0, "acc": 1.0, "pred": "3"}
    assert default_compute_score("aime_2024", "...\nAnswer: 4", "3")["score"] == -1.0
    assert default_compute_score("numina_olympiads", r"\boxed{\frac{1}{2}}", "0.5")["score"] == 1.0
    assert default_compute_score("hybridflow/arithmetic", "3", "3")["score"] == 1.0
    assert default_compute_score("hybridflow/countdown", "#### 1 + 2", {"target": 3, "numbers": [1, 2]})["score"] == 1.0
    with pytest.raises(ValueError, match="unknown scorer for data_source 'my/data'; valid names: .*openai/gsm8k"):
        default_compute_score("my/data", "x", "y")
    assert "HuggingFaceH4/MATH-500" in SCORERS


def test_default_batch_marks_failures_as_nan():
    out = default_compute_score_batch(["openai/gsm8k", "nope"], ["#### 1", "x"], ["1", "y"], [None, None])
    assert out[0]["score"] == 1.0 and out[1] != out[1]
