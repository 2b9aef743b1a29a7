"""``hiyouga/geometry3k``: the boxed answer graded by mathruler, plus a format bonus, as verl.

verl's geo3k scorer, rule for rule:

* **accuracy** (1.0 / 0.0): mathruler's ``extract_boxed_content`` takes the response's last
  ``\\boxed{...}`` (balanced braces; the string ``"None"`` when there is none) and mathruler's
  ``grade_answer`` compares it with the ground truth (PRM800K's grader: normalised strings,
  then sympy equality for simple expressions — ``0.5`` = ``\\frac{1}{2}``);
* **format** (1.0 / 0.0): the whole response matches ``<think>…</think>…\\boxed{…}…``
  (``.`` spanning newlines);
* **score** = ``(1 - format_score) * accuracy + format_score * format``, ``format_score = 0.1``:
  1.0 right and well formed, 0.9 right only, 0.1 well formed only, 0.0 neither.

mathruler is the grader verl uses; it is an optional dependency here (``pip install mathruler
pylatexenc``), imported on the first geometry3k score so other data sources never need it.
"""

from __future__ import annotations

import importlib
import re
from typing import Any

DATA_SOURCE = "hiyouga/geometry3k"
FORMAT_SCORE = 0.1
_FORMAT = re.compile(r"<think>.*</think>.*\\boxed\{.*\}.*", re.DOTALL)
_NO_BOX = "None"  # what mathruler's extract_boxed_content returns when there is no \boxed{}


def _mathruler() -> Any:
    try:
        grader = importlib.import_module("mathruler.grader")  # by name: mathruler ships no type information
    except ImportError as exc:
        raise ImportError(
            f"the {DATA_SOURCE} scorer grades with mathruler, as verl's does; install it: pip install mathruler "
            f"pylatexenc ({exc})"
        ) from exc
    return grader


def format_reward(solution_str: str) -> float:
    """1.0 when the response is ``<think>…</think>`` followed by a ``\\boxed{}`` answer."""
    return 1.0 if _FORMAT.fullmatch(solution_str) else 0.0


def compute_score(
    solution_str: str, ground_truth: Any, extra_info: dict | None = None, *, format_score: float = FORMAT_SCORE
) -> dict[str, Any]:
    """``{"score", "acc", "format", "pred"}`` (rules: module docstring); ``pred`` is the boxed
    answer, ``""`` when mathruler found none (its ``"None"``)."""
    grader = _mathruler()
    answer = grader.extract_boxed_content(solution_str)
    acc = 1.0 if grader.grade_answer(answer, str(ground_truth)) else 0.0
    formatted = format_reward(solution_str)
    score = (1.0 - format_score) * acc + format_score * formatted
    pred = "" if answer == _NO_BOX else answer
    return {"score": score, "acc": acc, "format": formatted, "pred": pred}
