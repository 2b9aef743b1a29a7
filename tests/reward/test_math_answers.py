r"""Competition-math scorers: hand-picked hard cases for extraction, normalisation and equivalence."""

from __future__ import annotations

import pytest

from hybridflow.reward import default_compute_score
from hybridflow.reward.scorers.math_answers import (
    compute_score_boxed,
    compute_score_dapo,
    equivalent,
    extract_dapo_answer,
    normalize_final_answer,
)


@pytest.mark.parametrize(
    "pred, truth",
    [
        (r"\frac{1}{2}", "0.5"),
        (r"\dfrac{1}{2}", r"\frac12"),
        ("1/2", r"\tfrac{1}{2}"),
        (r"\frac{\sqrt{2}}{2}", r"\frac{1}{\sqrt{2}}"),
        (r"\frac{\sqrt2}{2}", r"\frac{\sqrt{2}}{2}"),
        (r"5\text{ cm}", "5"),
        (r"12 \text{ inches}", "12"),
        (r"90^\circ", "90"),
        (r"1{,}000", "1000"),
        ("1,000", "1000"),
        (r"\$18.90", "18.90"),
        (r"x = 3", "3"),
        (r"\left( 1, 2 \right)", "(1,2)"),
        (r"\{1, 2\}", r"\{2, 1\}"),
        (r"3\!\cdot\!2", "6"),
        (r"\text{(B)}", "(B)"),
        ("2^{10}", "1024"),
    ],
)
def test_equal_answers_written_differently(pred, truth):
    assert equivalent(pred, truth)


@pytest.mark.parametrize(
    "pred, truth",
    [
        ("0.33", r"\frac{1}{3}"),  # close is not equal
        (r"\frac{1}{2}", r"\frac{1}{3}"),
        ("12", "1,2"),  # a thousands separator is not a list
        ("(1,2)", "(2,1)"),  # an ordered pair in the other order
        (r"\sqrt{2}", "2"),
        ("-3", "3"),
        ("3.0001", "3"),
        (r"x = 4", "3"),
        (None, "3"),
    ],
)
def test_wrong_answers_that_look_right(pred, truth):
    assert not equivalent(pred, truth)


def test_boxed_extraction_takes_the_last_balanced_box():
    text = r"First \boxed{2}, but finally \boxed{\frac{\sqrt{2}}{2}} is it."
    assert compute_score_boxed(text, r"\frac{1}{\sqrt{2}}") == {"score": 1.0, "acc": 1.0, "pred": r"\frac{\sqrt{2}}{2}"}
    nested = r"\boxed{\boxed{7}}"
    assert compute_score_boxed(nested, "7")["score"] == 1.0
    assert compute_score_boxed(r"\boxed{\frac{1}{2}", "0.5") == {"score": 0.0, "acc": 0.0, "pred": ""}  # unbalanced
    assert compute_score_boxed("the answer is 7", "7")["score"] == 0.0  # nothing boxed
    assert compute_score_boxed(r"\boxed{7}", r"\boxed{7}")["score"] == 1.0  # a boxed ground truth


def test_dapo_style_answer_line_and_scale():
    assert extract_dapo_answer("work...\nAnswer: 42\n") == "42"
    assert extract_dapo_answer(r"no line but \boxed{5}") == "5"
    assert extract_dapo_answer("Answer: 1\n" + "x" * 400) is None  # outside the last 300 characters
    assert compute_score_dapo("...\nanswer: $\\frac{3}{4}$", "0.75") == {"score": 1.0, "acc": 1.0, "pred": "$\\frac{3}{4}$"}
    assert compute_score_dapo("Answer: 5", "6") == {"score": -1.0, "acc": 0.0, "pred": "5"}
    assert compute_score_dapo("nothing", "6") == {"score": -1.0, "acc": 0.0, "pred": ""}


def test_normalisation_rules():
    assert normalize_final_answer(r"x = \$1{,}000\text{ cents}") == "1000"
    assert normalize_final_answer(r"\dfrac{1}{2}") == r"\frac{1}{2}"
    assert normalize_final_answer(r"\frac12") == r"\frac{1}{2}"
    assert normalize_final_answer(r"\sqrt3") == r"\sqrt{3}"
    assert normalize_final_answer("$7$.") == "7"


def test_routing_by_data_source():
    assert default_compute_score("DigitalLearningGmbH/MATH-lighteval", r"\boxed{0.5}", r"\frac12")["score"] == 1.0
    assert default_compute_score("HuggingFaceH4/MATH-500", r"\boxed{3}", "4")["score"] == 0.0
    assert default_compute_score("math", "Answer: 3", "3")["score"] == 1.0
    assert default_compute_score("aime25", "Answer: 3", "4")["score"] == -1.0
    assert default_compute_score("numina_cn_k12", r"\boxed{x=2}", "2")["pred"] == "x=2"
