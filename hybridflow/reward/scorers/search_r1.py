"""``searchR1_*`` (Search-R1's QA sets): exact match of the last ``<answer>`` span, as verl.

verl's search_r1_like_qa_em scorer, rule for rule:

* the answer is the content of the **last** ``<answer>…</answer>`` (non-greedy, spanning
  newlines, stripped); no complete pair → **0.0**;
* it is correct when its normalised form equals the normalised form of any of the ground
  truth's ``target`` answers (a string or a list). Normalising lower-cases, drops ASCII
  punctuation, replaces the words ``a``, ``an``, ``the`` by spaces and collapses whitespace:
  ``"The Eiffel-Tower!"`` → ``"eiffeltower"``;
* correct → **1.0**, or **0.25** when the response has more than 10 ``<answer>`` or more than 10
  ``</answer>`` tags (spamming tags is not rewarded); wrong → **0.0** (``format_score``).

The ground truth is verl's ``{"target": [...]}`` mapping (parquet gives the list as an array).
"""

from __future__ import annotations

import re
import string
from collections.abc import Mapping
from typing import Any

DATA_SOURCES: tuple[str, ...] = (
    "searchR1_nq",
    "searchR1_triviaqa",
    "searchR1_popqa",
    "searchR1_hotpotqa",
    "searchR1_2wikimultihopqa",
    "searchR1_musique",
    "searchR1_bamboogle",
)
MAX_TAGS = 10
_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = str.maketrans("", "", string.punctuation)


def normalize_answer(text: str) -> str:
    """Search-R1's normal form (see the module docstring), in its order of steps."""
    text = text.lower().translate(_PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def extract_answer(solution_str: str) -> str | None:
    """The stripped content of the last ``<answer>…</answer>``, or None."""
    matches = _ANSWER.findall(solution_str)
    return matches[-1].strip() if matches else None


def targets_of(ground_truth: Any) -> list[str]:
    """The accepted answers of a row (``ground_truth["target"]``: a string or a sequence)."""
    if not isinstance(ground_truth, Mapping) or "target" not in ground_truth:
        raise ValueError(
            f"a searchR1 ground truth is a mapping with a 'target' answer list, got {type(ground_truth).__name__}"
        )
    target = ground_truth["target"]
    return [target] if isinstance(target, str) else [str(t) for t in target]


def compute_score(
    solution_str: str,
    ground_truth: Any,
    extra_info: dict | None = None,
    *,
    format_score: float = 0.0,
    score: float = 1.0,
) -> dict[str, Any]:
    """``{"score", "acc", "pred"}`` (rules: module docstring); ``pred`` is the extracted answer."""
    targets = targets_of(ground_truth)
    answer = extract_answer(solution_str)
    if answer is None:
        return {"score": 0.0, "acc": 0.0, "pred": ""}
    prediction = normalize_answer(answer)
    if not any(normalize_answer(t) == prediction for t in targets):
        return {"score": float(format_score), "acc": 0.0, "pred": answer}
    spammed = solution_str.count("<answer>") > MAX_TAGS or solution_str.count("</answer>") > MAX_TAGS
    return {"score": score / 4 if spammed else float(score), "acc": 1.0, "pred": answer}
