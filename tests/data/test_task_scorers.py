"""The built-in tasks' scorers (each in its task module) and the number helpers they share."""

from __future__ import annotations

import pytest

from hybridflow.data.tasks import arithmetic, countdown, gsm8k
from hybridflow.data.tasks.answers import (
    last_number,
    marked_answer,
    parse_number,
    same_number,
)


def test_numbers():
    assert last_number("a 1,200 b -3 c 4.5.") == "4.5"
    assert last_number("3, 4, 5") == "5"
    assert marked_answer("x #### 1 then ####  $1,200 end") == "1,200"
    assert marked_answer("#### none") is None
    assert parse_number("$1,200") == 1200 and parse_number("-0.50") == parse_number("-.5")
    assert parse_number("12a") is None
    assert same_number("72.0", "72") and not same_number(None, "1") and not same_number("7", "x")


@pytest.mark.parametrize(
    "text, strict, flexible",
    [
        ("so 5 + 2 = 7\n#### 7", 1.0, 1.0),
        ("the answer is 7", 0.0, 1.0),
        ("#### 7 apples, 9 pears", 1.0, 0.0),
        ("#### $1,200", 0.0, 0.0),  # ground truth 7
        ("####7.", 1.0, 1.0),
    ],
)
def test_gsm8k_strict_and_flexible(text, strict, flexible):
    assert gsm8k.compute_score(text, "7")["score"] == strict
    assert gsm8k.compute_score(text, "7", method="flexible")["score"] == flexible


def test_gsm8k_reads_only_the_last_300_chars():
    text = "#### 7" + " filler" * 60
    assert gsm8k.compute_score(text, "7") == {"score": 0.0, "acc": 0.0, "pred": ""}
    assert gsm8k.compute_score(text[:6] + " " * 10, "7", format_score=0.1) == {"score": 1.0, "acc": 1.0, "pred": "7"}
    assert gsm8k.compute_score("#### 8", "7", format_score=0.1) == {"score": 0.1, "acc": 0.0, "pred": "8"}
    with pytest.raises(ValueError, match="unknown GSM8K extraction method"):
        gsm8k.extract_solution("x", "loose")


@pytest.mark.parametrize(
    "text, score, formatted",
    [
        ("23 + 45 = 68\n#### 68", 1.0, 1.0),
        ("It is 68.", 1.0, 0.0),  # lenient: the last number
        ("#### 68.0", 1.0, 1.0),
        ("#### 67 but maybe 68", 0.0, 1.0),  # the marker wins over a later number
        ("#### and then 68", 1.0, 0.0),  # a marker without a number does not count
        ("no digits here", 0.0, 0.0),
    ],
)
def test_arithmetic_rule(text, score, formatted):
    result = arithmetic.compute_score(text, "68")
    assert {k: result[k] for k in ("score", "acc", "formatted")} == {"score": score, "acc": score, "formatted": formatted}
    assert result["pred"] == {"no digits here": "", "#### 67 but maybe 68": "67"}.get(text, result["pred"])
    assert (result["pred"] != "") == (text != "no digits here")


def test_arithmetic_strict_and_negative():
    assert arithmetic.compute_score("It is 68.", "68", strict=True)["score"] == 0.0
    assert arithmetic.compute_score("12 - 30 = -18\n#### -18", "-18")["score"] == 1.0


TRUTH = {"target": 18, "numbers": [2, 3, 4]}


@pytest.mark.parametrize(
    "text, score",
    [
        ("#### (2 + 4) * 3", 1.0),
        ("#### 3 * (4 + 2) = 18", 1.0),
        ("<answer>(4 + 2) * 3</answer>", 1.0),
        ("#### 2 * 3 * 4", 0.1),  # wrong value (24)
        ("#### (2 + 4) * 3 * 1", 0.1),  # uses a number not given
        ("#### 18", 0.1),  # does not use the numbers
        ("#### import os", 0.1),
        ("#### (2 + 4) / 0 * 3", 0.1),
        ("no equation at all", 0.0),
    ],
)
def test_countdown_rule(text, score):
    result = countdown.compute_score(text, TRUTH)
    assert result["score"] == score
    assert (result["pred"] == "") == (text == "no equation at all")


def test_countdown_ground_truth_checked():
    with pytest.raises(ValueError, match="countdown ground_truth must be"):
        countdown.compute_score("#### 1 + 2", "3")
