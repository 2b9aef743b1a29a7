"""Rewards on the controller: scoring functions, custom-function loading and the reward managers.

Everything here runs in the trainer's process (or in scorer processes it starts), never in a
worker group: the managers (``base.py``, ``naive.py``, ``batch.py``, ``dapo.py``), a user's
reward file (``custom.py``), the scorer processes (``pool.py`` starts and keeps them,
``scorer_process.py`` is their side: isolation, memory cap, the call loop), per-call timeouts
(``calls.py``, ``executors.py``), checks and fault metrics (``outcomes.py``), the LLM judge
client (``judge.py``) and the generic scorers with the ``data_source`` registry (``scorers/``;
each built-in task's scorer lives in its task module, ``hybridflow/data/tasks/<task>.py``).
The reward *model* is a worker: ``hybridflow/workers/reward_model.py``.

``build_reward_manager("naive", tokenizer, compute_score=..., timeout_s=...)`` → a callable
``manager(data) -> (reward_tensor (B, T), reward_extra_info)``; step metrics from
``reward_fault_metrics(reward_extra_info)``.
"""

from __future__ import annotations

from typing import Any

from hybridflow.reward.base import (
    DEFAULT_TIMEOUT_S,
    REWARD_MANAGERS,
    RULE_SCORE,
    RewardManager,
    ScoreItem,
    decode_items,
    place_scores,
    response_lengths,
)
from hybridflow.reward.batch import BatchRewardManager
from hybridflow.reward.custom import CustomRewardFunction, load_custom_reward_function
from hybridflow.reward.dapo import DAPORewardManager, overlong_penalty
from hybridflow.reward.executors import (
    EXECUTORS,
    CallResult,
    ScorerPool,
    ScorerStartError,
    run_calls,
)
from hybridflow.reward.naive import NaiveRewardManager, PrimeRewardManager
from hybridflow.reward.outcomes import (
    REWARD_ERROR,
    REWARD_TIMEOUT,
    ScoreOutcome,
    normalize_result,
    reward_fault_metrics,
    scored_extra_floats,
)
from hybridflow.reward.scorer_process import DEFAULT_MEMORY_LIMIT_MB, ScorerSettings
from hybridflow.reward.scorers import (
    SCORERS,
    default_compute_score,
    default_compute_score_batch,
)


def build_reward_manager(name: str, tokenizer: Any, **kwargs: Any) -> RewardManager:
    """``REWARD_MANAGERS.get(name)(tokenizer, **kwargs)``; an unknown name lists the valid ones."""
    return REWARD_MANAGERS.get(name)(tokenizer, **kwargs)


__all__ = [
    "DEFAULT_MEMORY_LIMIT_MB",
    "DEFAULT_TIMEOUT_S",
    "EXECUTORS",
    "REWARD_ERROR",
    "REWARD_MANAGERS",
    "REWARD_TIMEOUT",
    "RULE_SCORE",
    "SCORERS",
    "BatchRewardManager",
    "CallResult",
    "CustomRewardFunction",
    "DAPORewardManager",
    "NaiveRewardManager",
    "PrimeRewardManager",
    "RewardManager",
    "ScoreItem",
    "ScoreOutcome",
    "ScorerPool",
    "ScorerSettings",
    "ScorerStartError",
    "build_reward_manager",
    "decode_items",
    "default_compute_score",
    "default_compute_score_batch",
    "load_custom_reward_function",
    "normalize_result",
    "overlong_penalty",
    "place_scores",
    "response_lengths",
    "reward_fault_metrics",
    "run_calls",
    "scored_extra_floats",
]
