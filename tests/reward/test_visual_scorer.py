"""The ``hybridflow/shapes`` scorer: exact answers, tolerant of case, spaces, a final period, \\boxed{}."""

from __future__ import annotations

import pytest

from hybridflow.reward.scorers import default_compute_score
from hybridflow.reward.scorers.shapes import compute_score, normalize_answer


@pytest.mark.parametrize(
    ("response", "truth", "score", "pred"),
    [
        ("3", "3", 1.0, "3"),
        ("  3.\n", "3", 1.0, "3"),
        ("Three", "3", 1.0, "3"),
        ("\\boxed{4}", "4", 1.0, "4"),
        ("I count them: \\boxed{2} then \\boxed{5}", "5", 1.0, "5"),  # the last box
        ("Red", "red", 1.0, "red"),
        ("  RED. ", "red", 1.0, "red"),
        ("\\boxed{Purple}", "purple", 1.0, "purple"),
        ("dark  blue", "dark blue", 1.0, "dark blue"),  # whitespace collapsed on both sides
        ("There are 3 dots.", "3", 0.0, "there are 3 dots"),  # not the answer alone
        ("4", "3", 0.0, "4"),
        ("red", "blue", 0.0, "red"),
        ("3..", "3", 0.0, "3."),  # one trailing period only
        ("", "3", 0.0, ""),
        ("\\boxed{}", "3", 0.0, ""),
    ],
)
def test_scores(response: str, truth: str, score: float, pred: str) -> None:
    assert compute_score(response, truth) == {"score": score, "acc": score, "pred": pred}


def test_number_words_up_to_twenty() -> None:
    assert normalize_answer("zero") == "0" and normalize_answer("Twenty") == "20"
    assert normalize_answer("twenty-one") == "twenty-one"  # beyond the list: left as it is


def test_an_int_ground_truth_is_read_as_its_digits() -> None:
    assert compute_score("six", 6)["score"] == 1.0


@pytest.mark.parametrize("truth", [None, ["3"], {"answer": "3"}, True])
def test_a_bad_ground_truth_raises(truth) -> None:
    with pytest.raises(ValueError, match="shapes ground_truth must be a string"):
        compute_score("3", truth)


def test_registered_for_the_tasks_data_source() -> None:
    assert default_compute_score("hybridflow/shapes", "\\boxed{Green}.", "green")["score"] == 1.0
    assert default_compute_score("hybridflow/shapes", "green", "red")["score"] == 0.0
