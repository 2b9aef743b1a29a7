"""Rewards: scoring functions, custom-function loading and the reward managers.

``build_reward_manager("naive", tokenizer, compute_score=..., timeout_s=...)`` → a callable
``manager(data) -> (reward_tensor (B, T), reward_extra_info)``; step metrics from
``reward_fault_metrics(reward_extra_info)``.
"""

from __future__ import annotations

from typing import Any

from hybridflow.workers.reward.base import (
    DEFAULT_TIMEOUT_S,
    REWARD_MANAGERS,
    RULE_SCORE,
    RewardManager,
    ScoreItem,
    decode_items,
    place_scores,
    response_lengths,
)
from hybridflow.workers.reward.batch import BatchRewardManager
from hybridflow.workers.reward.custom import CustomRewardFunction, load_custom_reward_function
from hybridflow.workers.reward.dapo import DAPORewardManager, overlong_penalty
from hybridflow.workers.reward.executors import EXECUTORS, CallResult, ScorerPool, ScorerStartError, run_calls
from hybridflow.workers.reward.naive import NaiveRewardManager, PrimeRewardManager
from hybridflow.workers.reward.outcomes import (
    REWARD_ERROR,
    REWARD_TIMEOUT,
    ScoreOutcome,
    normalize_result,
    reward_fault_metrics,
    scored_extra_floats,
)
from hybridflow.workers.reward.sandbox import DEFAULT_MEMORY_LIMIT_MB, ScorerSettings
from hybridflow.workers.reward.scores import SCORERS, default_compute_score, default_compute_score_batch


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
