"""Scorer for the built-in ``hybridflow/countdown`` task: the equation itself is checked.

The equation is the text after the last ``####`` up to the end of that line, or else the
content of the last ``<answer>...</answer>``; anything from an ``=`` on is dropped
(``"(1 + 2) * 3 = 9"`` → ``"(1 + 2) * 3"``). Scores:

* 1.0 — it uses exactly the given numbers, each once (as a multiset), contains only integers,
  ``+ - * /`` and parentheses, and evaluates exactly to the target;
* ``format_score`` (0.1) — an equation was found but fails any of those checks;
* 0.0 — no equation found.

``ground_truth`` is ``{"target": int, "numbers": [int, ...]}``; anything else raises (and the
reward manager scores the item 0 and counts an error).
"""

from __future__ import annotations

import re
from typing import Any

from hybridflow.data.tasks.expr import ExpressionError, evaluate_expression, expression_numbers

_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


def extract_equation(solution_str: str) -> str | None:
    """The candidate equation per the rule above, or None."""
    if "####" in solution_str:
        equation = solution_str.rsplit("####", 1)[1].strip().split("\n", 1)[0]
    else:
        tags = _ANSWER_TAG.findall(solution_str)
        if not tags:
            return None
        equation = tags[-1]
    equation = equation.split("=", 1)[0].strip()
    return equation or None


def _check_ground_truth(ground_truth: Any) -> tuple[int, list[int]]:
    if not isinstance(ground_truth, dict) or "target" not in ground_truth or "numbers" not in ground_truth:
        raise ValueError(f"countdown ground_truth must be {{'target': int, 'numbers': [int]}}, got {ground_truth!r}")
    return int(ground_truth["target"]), [int(n) for n in ground_truth["numbers"]]


def compute_score(
    solution_str: str, ground_truth: Any, extra_info: dict | None = None, *, format_score: float = 0.1
) -> dict[str, float]:
    """``{"score", "acc", "formatted", "pred"}`` per the rule above (``acc`` is 1.0 only when
    correct; ``pred`` the extracted equation, "" if none)."""
    target, numbers = _check_ground_truth(ground_truth)
    equation = extract_equation(solution_str)
    if equation is None:
        return {"score": 0.0, "acc": 0.0, "formatted": 0.0, "pred": ""}
    correct = False
    if sorted(expression_numbers(equation)) == sorted(numbers):
        try:
            correct = evaluate_expression(equation) == target
        except ExpressionError:
            correct = False
    return {"score": 1.0 if correct else format_score, "acc": 1.0 if correct else 0.0, "formatted": 1.0,
            "pred": equation}
