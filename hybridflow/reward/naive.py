"""The ``naive`` and ``prime`` reward managers: one scorer call per item.

``naive`` scores items one after another in a single worker process (so a hang is still cut
off at ``timeout_s``); ``prime`` spreads them over several processes, for scorers that are
slow (code execution, symbolic math).
"""

from __future__ import annotations

import os
from typing import Any

from hybridflow.reward.base import REWARD_MANAGERS, RewardManager


@REWARD_MANAGERS.register("naive")
class NaiveRewardManager(RewardManager):
    """Items scored in order by one worker; see :class:`RewardManager` for the arguments."""


def default_num_workers() -> int:
    """``min(8, cpu count)``: scoring processes for ``prime``."""
    return max(1, min(8, os.cpu_count() or 1))


@REWARD_MANAGERS.register("prime")
class PrimeRewardManager(RewardManager):
    """Items scored in parallel by ``num_workers`` processes (default ``min(8, cpu count)``);
    the other keyword arguments are :class:`RewardManager`'s."""

    def __init__(self, tokenizer: Any, *, num_workers: int | None = None, **kwargs: Any) -> None:
        super().__init__(tokenizer, num_workers=default_num_workers() if num_workers is None else num_workers, **kwargs)
