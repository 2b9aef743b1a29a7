"""Scorer for the built-in ``hybridflow/tool-lookup`` task.

1.0 when the number after the last ``####`` in the response is the row's code (as a string of
digits: ``#### 48213``), else 0.0. Strict on purpose: the tool's own output (the bare code)
sits in the decoded response of an agent trajectory, so a lenient "last number" rule would
reward a model that called the tool but never answered. ``formatted`` is 1.0 when a ``####``
answer was given at all.
"""

from __future__ import annotations

from typing import Any

from hybridflow.workers.reward.scores.numbers import marked_answer


def compute_score(solution_str: str, ground_truth: Any, extra_info: dict | None = None) -> dict[str, float | str]:
    """``{"score": 1.0 | 0.0, "acc": same, "formatted": 1.0 | 0.0, "pred": the answer or ""}``."""
    answer = marked_answer(solution_str)
    correct = 1.0 if answer is not None and answer.strip() == str(ground_truth).strip() else 0.0
    return {"score": correct, "acc": correct, "formatted": 0.0 if answer is None else 1.0, "pred": answer or ""}
