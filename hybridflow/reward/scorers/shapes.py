"""The reward of the built-in ``shapes`` task (``hybridflow/shapes`` rows): the exact answer.

The answer is the content of the last ``\\boxed{...}`` when the response has one, else the whole
response. Answer and ground truth are both normalised (:func:`normalize_answer`): lower case,
whitespace collapsed, one trailing period dropped, a number word up to twenty (``"three"``) as
its digits. Equal → 1.0, else 0.0. "There are 3 dots." scores 0: the prompt asks for the answer
alone, and a search for "a number somewhere" would reward "1 2 3 4 5 6" too.
"""

from __future__ import annotations

import re
from typing import Any

from hybridflow.data.tasks.shapes import DATA_SOURCE
from hybridflow.reward.scorers.boxed import last_boxed

__all__ = ["DATA_SOURCE", "compute_score", "extract_answer", "normalize_answer"]

NUMBER_WORDS: tuple[str, ...] = tuple(
    (
        "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen "
        "fifteen sixteen seventeen eighteen nineteen twenty"
    ).split()
)
_SPACES = re.compile(r"\s+")


def normalize_answer(text: str) -> str:
    """Lower case, whitespace collapsed, one trailing period dropped, a number word as digits."""
    answer = _SPACES.sub(" ", text).strip().lower().removesuffix(".").strip()
    return str(NUMBER_WORDS.index(answer)) if answer in NUMBER_WORDS else answer


def extract_answer(solution_str: str) -> str:
    """The last ``\\boxed{}``'s content, else the whole response."""
    boxed = last_boxed(solution_str)
    return solution_str if boxed is None else boxed


def compute_score(solution_str: str, ground_truth: Any, extra_info: dict | None = None) -> dict[str, float | str]:
    """``{"score": 1.0 | 0.0, "acc": same, "pred": the normalised answer}`` (rule: module docstring)."""
    if isinstance(ground_truth, bool) or not isinstance(ground_truth, (str, int)):
        raise ValueError(f"shapes ground_truth must be a string (a number or a colour name), got {ground_truth!r}")
    pred = normalize_answer(extract_answer(solution_str))
    correct = 1.0 if pred == normalize_answer(str(ground_truth)) else 0.0
    return {"score": correct, "acc": correct, "pred": pred}
