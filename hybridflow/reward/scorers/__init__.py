"""Scoring functions by ``data_source``, and ``default_compute_score`` that dispatches on it.

The contract (verl's): ``compute_score(data_source, solution_str, ground_truth, extra_info=None)``
returns a float, or a dict with at least ``"score"`` (other keys are logged). Each entry of
``SCORERS`` is the per-source part, ``fn(solution_str, ground_truth, extra_info)``. Add a data
source with ``SCORERS.add("my/source", fn)`` or point ``custom_reward_function.path`` at a file.

Generic scorers live here (``boxed.py``, ``math_answers.py``, ``code.py``, ``geometry3k.py``,
``search_r1.py``); a built-in task's
scorer lives in its task module, next to its generator (``hybridflow/data/tasks/<task>.py``), except
``shapes.py``'s, which uses ``boxed.py`` (the data layer may not import the reward layer).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hybridflow.data.tasks import arithmetic, countdown, gsm8k, tool_lookup
from hybridflow.data.tasks.code_functions import DATA_SOURCE as CODE_FUNCTIONS_SOURCE
from hybridflow.reward.scorers import code, geometry3k, math_answers, search_r1, shapes
from hybridflow.utils.registry import Registry

ScoreResult = float | dict[str, Any]
Scorer = Callable[[str, Any, "dict | None"], ScoreResult]

# verl's routing: MATH-style and NuminaMath sources by their last \boxed{} answer (0 / 1);
# DAPO-style sources by their "Answer:" line (±1), and so is every source named aime*.
MATH_SOURCES: tuple[str, ...] = (
    "lighteval/MATH",
    "DigitalLearningGmbH/MATH-lighteval",
    "HuggingFaceH4/MATH-500",
    "numina_aops_forum",
    "numina_synthetic_math",
    "numina_amc_aime",
    "numina_synthetic_amc",
    "numina_cn_k12",
    "numina_olympiads",
)
MATH_DAPO_SOURCES: tuple[str, ...] = ("math_dapo", "math", "math_dapo_reasoning")
MATH_DAPO_PREFIX = "aime"

SCORERS: Registry[Scorer] = Registry("scorer for data_source")
SCORERS.add(gsm8k.DATA_SOURCE, gsm8k.compute_score)
for _source in MATH_SOURCES:
    SCORERS.add(_source, math_answers.compute_score_boxed)
for _source in MATH_DAPO_SOURCES:
    SCORERS.add(_source, math_answers.compute_score_dapo)
SCORERS.add(geometry3k.DATA_SOURCE, geometry3k.compute_score)
for _source in search_r1.DATA_SOURCES:
    SCORERS.add(_source, search_r1.compute_score)
# the built-in tasks: each task module holds its generator and its scorer
SCORERS.add(arithmetic.DATA_SOURCE, arithmetic.compute_score)
SCORERS.add(countdown.DATA_SOURCE, countdown.compute_score)
SCORERS.add(tool_lookup.DATA_SOURCE, tool_lookup.compute_score)
SCORERS.add(shapes.DATA_SOURCE, shapes.compute_score)  # its scorer reads \boxed{}, a reward-side helper
# code: test cases run in the sandbox (verl's code sources and the built-in task)
CODE_SOURCES: tuple[str, ...] = (*code.VERL_CODE_SOURCES, CODE_FUNCTIONS_SOURCE)
for _source in CODE_SOURCES:
    SCORERS.add(_source, code.compute_score)


def default_compute_score(
    data_source: str,
    solution_str: str,
    ground_truth: Any,
    extra_info: dict | None = None,
    *,
    code_sandbox: code.CodeSandboxSpec | None = None,
) -> ScoreResult:
    """Score one response with the scorer registered for ``data_source``.

    An unknown source raises ``ValueError`` listing the known ones; ``aime*`` sources (AIME 2024,
    aime25, ...) are scored as ``math_dapo``. Code sources run their tests where
    ``code_sandbox`` says (default: the local sandbox with default limits).
    """
    if data_source not in SCORERS and data_source.startswith(MATH_DAPO_PREFIX):
        return math_answers.compute_score_dapo(solution_str, ground_truth, extra_info)
    if data_source in CODE_SOURCES:
        return code.compute_score(solution_str, ground_truth, extra_info, sandbox=code_sandbox)
    return SCORERS.get(data_source)(solution_str, ground_truth, extra_info)


def default_compute_score_batch(
    data_sources: list[str], solution_strs: list[str], ground_truths: list[Any], extra_infos: list[dict | None]
) -> list[float | dict[str, Any]]:
    """The batch form (for the ``batch`` manager): one result per item.

    An item whose scorer raises gets ``nan``, which the reward manager counts as that item's
    error (score 0) instead of failing the whole batch.
    """
    results: list[float | dict[str, Any]] = []
    for source, solution, truth, extra in zip(data_sources, solution_strs, ground_truths, extra_infos, strict=True):
        try:
            results.append(default_compute_score(source, solution, truth, extra))
        except Exception:  # noqa: BLE001 - reported per item as nan, see docstring
            results.append(float("nan"))
    return results


__all__ = ["MATH_DAPO_SOURCES", "MATH_SOURCES", "SCORERS", "default_compute_score", "default_compute_score_batch"]
