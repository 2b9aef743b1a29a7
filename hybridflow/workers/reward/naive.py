"""The ``naive`` and ``prime`` reward managers: one scorer call per item.

``naive`` scores items one after another in a single worker process (so a hang is still cut
off at ``timeout_s``); ``prime`` spreads them over several processes, for scorers that are
slow (code execution, symbolic math).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from hybridflow import fields as F
from hybridflow.workers.reward.scores.code import CodeSandboxSpec
from hybridflow.workers.reward.base import DEFAULT_TIMEOUT_S, REWARD_MANAGERS, RewardManager
from hybridflow.workers.reward.sandbox import DEFAULT_MEMORY_LIMIT_MB


@REWARD_MANAGERS.register("naive")
class NaiveRewardManager(RewardManager):
    """Items scored in order by one worker; see :class:`RewardManager` for the arguments."""


def default_num_workers() -> int:
    """``min(8, cpu count)``: scoring processes for ``prime``."""
    return max(1, min(8, os.cpu_count() or 1))


@REWARD_MANAGERS.register("prime")
class PrimeRewardManager(RewardManager):
    """Items scored in parallel by ``num_workers`` processes (default ``min(8, cpu count)``)."""

    def __init__(
        self,
        tokenizer: Any,
        *,
        compute_score: Callable[..., Any] | None = None,
        num_examine: int = 0,
        reward_fn_key: str = F.DATA_SOURCE,
        timeout_s: float | None = DEFAULT_TIMEOUT_S,
        executor: str = "process",
        num_workers: int | None = None,
        memory_limit_mb: int | None = DEFAULT_MEMORY_LIMIT_MB,
        code_sandbox: CodeSandboxSpec | None = None,
        rule_reward: str = "off",
    ) -> None:
        super().__init__(
            tokenizer,
            compute_score=compute_score,
            num_examine=num_examine,
            reward_fn_key=reward_fn_key,
            timeout_s=timeout_s,
            executor=executor,
            num_workers=default_num_workers() if num_workers is None else num_workers,
            memory_limit_mb=memory_limit_mb,
            code_sandbox=code_sandbox, rule_reward=rule_reward,
        )
