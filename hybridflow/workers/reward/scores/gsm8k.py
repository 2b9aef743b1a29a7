"""Scorer for ``openai/gsm8k``.

Only the last 300 characters of the response are read (the final answer is at the end; this
also bounds the work on runaway generations).

* ``strict`` (the default): the answer is the number after the last ``####`` (a ``$`` and
  thousands commas are allowed: ``#### $1,200``). No ``####`` with a number → ``format_score``.
* ``flexible``: the answer is the last number anywhere in those 300 characters.

The answer scores ``score`` (1.0) if it equals the ground truth as a number, else ``format_score`` (0.0).
"""

from __future__ import annotations

from typing import Any

from hybridflow.workers.reward.scores.numbers import last_number, marked_answer, same_number

TAIL_CHARS = 300
METHODS: tuple[str, ...] = ("strict", "flexible")


def extract_solution(solution_str: str, method: str = "strict") -> str | None:
    """The answer string per ``method`` (see the module docstring), or None if there is none."""
    if method not in METHODS:
        raise ValueError(f"unknown GSM8K extraction method {method!r}; valid: {', '.join(METHODS)}")
    tail = solution_str[-TAIL_CHARS:]
    return marked_answer(tail) if method == "strict" else last_number(tail)


def compute_score(
    solution_str: str,
    ground_truth: Any,
    extra_info: dict | None = None,
    *,
    method: str = "strict",
    format_score: float = 0.0,
    score: float = 1.0,
) -> dict[str, Any]:
    """``{"score", "acc", "pred"}``: ``score`` if the extracted answer equals ``ground_truth``
    numerically, else ``format_score``; ``acc`` 1.0/0.0; ``pred`` the extracted answer ("" if none),
    which maj@N votes on."""
    answer = extract_solution(solution_str, method)
    correct = same_number(answer, ground_truth)
    return {"score": score if correct else format_score, "acc": float(correct), "pred": answer or ""}
