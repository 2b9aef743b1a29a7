"""``hiyouga/geometry3k`` and ``searchR1_*`` score as verl's geo3k and search_r1_like_qa_em
scorers do (issue 30, part 5). The expected values follow verl's rules (read from verl
b178a3c); the cases are our own."""

from __future__ import annotations

import numpy as np
import pytest

from hybridflow.reward.scorers import default_compute_score, geometry3k, search_r1

GEO = "hiyouga/geometry3k"


@pytest.mark.parametrize(
    ("response", "truth", "score", "acc", "fmt", "pred"),
    [
        ("<think>angles sum to 180</think> so x = \\boxed{3}.", "3", 1.0, 1.0, 1.0, "3"),
        ("x = \\boxed{3}", "3", 0.9, 1.0, 0.0, "3"),  # right, no <think> block
        ("<think>guess</think>\n\\boxed{4}", "3", 0.1, 0.0, 1.0, "4"),  # well formed, wrong
        ("<think>no box</think> the answer is 3", "3", 0.0, 0.0, 0.0, ""),
        ("Sure. <think>a</think> \\boxed{3}", "3", 0.9, 1.0, 0.0, "3"),  # format must start with <think>
        ("\\boxed{\\frac{1}{2}}", "0.5", 0.9, 1.0, 0.0, "\\frac{1}{2}"),  # equal under sympy
        ("\\boxed{2\\sqrt{3}}", "2\\sqrt3", 0.9, 1.0, 0.0, "2\\sqrt{3}"),  # nested braces
        ("\\boxed{30^{\\circ}}", "30", 0.9, 1.0, 0.0, "30^{\\circ}"),
        ("\\boxed{3} no wait \\boxed{5}", "3", 0.0, 0.0, 0.0, "5"),  # the last box counts
        ("<think>t</think> \\boxed{3", "3", 0.0, 0.0, 0.0, ""),  # unclosed box: no answer, no format
        ("<think>t</think>\\boxed{3.0}\nDone.", "3", 1.0, 1.0, 1.0, "3.0"),
    ],
)
def test_geometry3k_as_verl(response, truth, score, acc, fmt, pred):
    result = default_compute_score(GEO, response, truth)
    assert result == {"score": score, "acc": acc, "format": fmt, "pred": pred}


def test_geometry3k_format_weight_is_verls():
    assert geometry3k.compute_score("\\boxed{3}", "3", format_score=0.5)["score"] == 0.5
    assert geometry3k.format_reward("<think>\nmulti\nline\n</think>\n\\boxed{x}\n") == 1.0


TRUTH = {"target": ["Eiffel Tower", "la tour eiffel"]}


@pytest.mark.parametrize(
    ("response", "truth", "score", "acc", "pred"),
    [
        ("<think>search</think><answer> The Eiffel Tower. </answer>", TRUTH, 1.0, 1.0, "The Eiffel Tower."),
        ("<answer>La Tour Eiffel</answer>", TRUTH, 1.0, 1.0, "La Tour Eiffel"),  # any target
        ("<answer>Paris</answer>", TRUTH, 0.0, 0.0, "Paris"),
        ("The Eiffel Tower", TRUTH, 0.0, 0.0, ""),  # no tags
        ("<answer>Eiffel Tower", TRUTH, 0.0, 0.0, ""),  # unclosed
        ("<answer>Eiffel Tower</answer> no: <answer>Louvre</answer>", TRUTH, 0.0, 0.0, "Louvre"),  # the last counts
        ("<answer>Louvre</answer> no: <answer>\nEiffel\n Tower </answer>", TRUTH, 1.0, 1.0, "Eiffel\n Tower"),
        ("<answer>THE   eiffel tower!!</answer>", TRUTH, 1.0, 1.0, "THE   eiffel tower!!"),
        ("<answer>x</answer>" * 9 + "<answer>Eiffel Tower</answer>", TRUTH, 1.0, 1.0, "Eiffel Tower"),  # 10 tags
        ("<answer>x</answer>" * 10 + "<answer>Eiffel Tower</answer>", TRUTH, 0.25, 1.0, "Eiffel Tower"),  # 11
        ("</answer>" * 11 + "<answer>Eiffel Tower</answer>", TRUTH, 0.25, 1.0, "Eiffel Tower"),
        ("<answer>x<answer>Eiffel Tower</answer>", TRUTH, 0.0, 0.0, "x<answer>Eiffel Tower"),  # non-greedy
        ("<answer>globe theatre</answer>", {"target": "The Globe Theatre"}, 1.0, 1.0, "globe theatre"),
        ("<answer>globe atre</answer>", {"target": "The Globe Theatre"}, 0.0, 0.0, "globe atre"),  # words only
        ("<answer>JeanPaul</answer>", {"target": "Jean-Paul"}, 1.0, 1.0, "JeanPaul"),  # punctuation dropped
        ("<answer>O’Neal</answer>", {"target": "O'Neal"}, 0.0, 0.0, "O’Neal"),  # ASCII punctuation only
        ("<answer>1969</answer>", {"target": np.array(["July 1969", "1969"], dtype=object)}, 1.0, 1.0, "1969"),
    ],
)
def test_search_r1_as_verl(response, truth, score, acc, pred):
    for source in search_r1.DATA_SOURCES:
        assert default_compute_score(source, response, truth) == {"score": score, "acc": acc, "pred": pred}


def test_search_r1_normal_form_and_bad_ground_truth():
    assert search_r1.normalize_answer("  The  Cat's  a-MAZE-ing, an hour!") == "cats amazeing hour"
    assert len(search_r1.DATA_SOURCES) == 7
    with pytest.raises(ValueError, match="a searchR1 ground truth is a mapping with a 'target' answer list, got str"):
        default_compute_score("searchR1_nq", "<answer>Paris</answer>", "Paris")
