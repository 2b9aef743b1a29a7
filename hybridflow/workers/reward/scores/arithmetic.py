"""Scorer for the built-in ``hybridflow/arithmetic`` task.

What scores 1.0, exactly: the response's *final answer* equals the ground-truth integer as a
number (``68``, ``68.0`` and ``#### 68`` all match ``"68"``), where the final answer is

1. the number right after the last ``####`` that is followed by a number, if there is one;
2. otherwise (lenient, the default) the last number anywhere in the response;
   with ``strict=True`` a response without ``#### <number>`` scores 0.

Everything else scores 0.0. The returned dict also carries ``acc`` (same as ``score``) and
``formatted`` (1.0 if the answer came from a ``####`` marker), so the logs show whether the
model learned the format as well as the arithmetic.
"""

from __future__ import annotations

from typing import Any

from hybridflow.workers.reward.scores.numbers import last_number, marked_answer, same_number


def extract_answer(solution_str: str, strict: bool = False) -> tuple[str | None, bool]:
    """``(answer, formatted)``: the ``####`` answer if present, else the last number unless ``strict``."""
    marked = marked_answer(solution_str)
    if marked is not None:
        return marked, True
    return (None if strict else last_number(solution_str)), False


def compute_score(
    solution_str: str, ground_truth: Any, extra_info: dict | None = None, *, strict: bool = False
) -> dict[str, float]:
    """``{"score": 1.0 | 0.0, "acc": same, "formatted": 1.0 | 0.0, "pred": the answer or ""}`` per
    the rule above (``pred`` is what maj@N votes on)."""
    answer, formatted = extract_answer(solution_str, strict)
    correct = 1.0 if same_number(answer, ground_truth) else 0.0
    return {"score": correct, "acc": correct, "formatted": 1.0 if formatted else 0.0, "pred": answer or ""}
