"""Format + answer reward for RL from a base model (R1-Zero style), as a verl reward file.

    custom_reward_function.path=examples/r1_zero/reward.py

A base model does not stop after answering: it goes on with a made-up next question. Only its
first turn counts — the text before the first blank line or ``"\\nQuestion:"``. In that turn:

* ``formatted`` = 1 when the turn ends with ``#### <integer>`` (a full stop or spaces may follow)
  and has no other ``####``;
* ``acc`` = 1 when it is formatted and the integer equals the ground truth.

``score = acc + format_weight * formatted`` (``format_weight`` from
``custom_reward_function.reward_kwargs``, default 0.1): a right answer in the format scores
1 + w, a wrong one in the format w, anything else 0. ``pred`` is the integer or ``""``.
"""

from __future__ import annotations

import re
from typing import Any

_TURN_END = re.compile(r"\n\s*\n|\nQuestion:")
_FINAL = re.compile(r"####\s*(-?\d+)\s*\.?\s*$")


def first_turn(response: str) -> str:
    """The response up to the first blank line or ``"\\nQuestion:"``."""
    end = _TURN_END.search(response)
    return response if end is None else response[: end.start()]


def compute_score(
    data_source: str, solution_str: str, ground_truth: Any, extra_info: dict | None = None, format_weight: float = 0.1
) -> dict[str, float | str]:
    turn = first_turn(solution_str)
    final = _FINAL.search(turn)
    formatted = final is not None and turn.count("####") == 1
    pred = final.group(1) if formatted and final is not None else ""
    acc = 1.0 if formatted and int(pred) == int(str(ground_truth).strip()) else 0.0
    return {"score": acc + format_weight * float(formatted), "acc": acc, "formatted": float(formatted), "pred": pred}
