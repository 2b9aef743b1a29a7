from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

_FILE = Path(__file__).resolve().parents[2] / "examples" / "r1_zero" / "reward.py"
_spec = importlib.util.spec_from_file_location("r1_zero_reward", _FILE)
reward = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(reward)


@pytest.mark.parametrize(
    ("response", "score", "acc", "formatted", "pred"),
    [
        (" 8 + 11 = 19. #### 19\n\nQuestion: What is 3 + 4?\nAnswer: #### 7", 1.1, 1.0, 1.0, "19"),
        (" 8 + 11 = 19. #### 19.", 1.1, 1.0, 1.0, "19"),
        (" 8 + 11 = 10. #### 10\nQuestion: What is", 0.1, 0.0, 1.0, "10"),
        (" 8 + 11 = 19\n\n#### 19", 0.0, 0.0, 0.0, ""),  # the answer is in the made-up next turn
        (" #### 19 #### 19", 0.0, 0.0, 0.0, ""),  # two markers
        (" 19", 0.0, 0.0, 0.0, ""),  # right number, no format
        (" #### 19 and more", 0.0, 0.0, 0.0, ""),  # the marker is not the end of the turn
        (" #### -3", 0.1, 0.0, 1.0, "-3"),
    ],
)
def test_score_format_and_answer(response, score, acc, formatted, pred):
    out = reward.compute_score("hybridflow/arithmetic", response, "19")
    assert out["score"] == pytest.approx(score)
    assert (out["acc"], out["formatted"], out["pred"]) == (acc, formatted, pred)


def test_format_weight_is_a_reward_kwarg():
    assert reward.compute_score("x", " #### 5", "19", format_weight=0.5)["score"] == 0.5
    assert reward.compute_score("x", " #### 19", "19", format_weight=0.0)["score"] == 1.0
