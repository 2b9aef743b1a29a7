"""The ``batch`` reward manager: one scorer call with lists for the whole batch.

The scorer is ``fn(data_sources, solution_strs, ground_truths, extra_infos)`` returning a list
with one float-or-dict per item (default: :func:`default_compute_score_batch`). ``timeout_s``
applies per item: the call may take ``timeout_s × number of items``. If the call raises, runs
past that or returns something other than a list of that length, every item of the batch
scores 0 and is counted; an invalid single entry only fails its item.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from hybridflow.reward.base import REWARD_MANAGERS, RewardManager, ScoreItem
from hybridflow.reward.executors import ERROR, OK, TIMEOUT, CallResult
from hybridflow.reward.outcomes import ScoreOutcome, to_outcome
from hybridflow.reward.scorers import default_compute_score_batch


@REWARD_MANAGERS.register("batch")
class BatchRewardManager(RewardManager):
    """See the module docstring; arguments as :class:`RewardManager`."""

    default_compute_score: Callable[..., Any] = staticmethod(default_compute_score_batch)

    def score_items(self, items: list[ScoreItem]) -> list[ScoreOutcome]:
        call = {
            "data_sources": [it.data_source for it in items],
            "solution_strs": [it.response_str for it in items],
            "ground_truths": [it.ground_truth for it in items],
            "extra_infos": [it.extra_info for it in items],
        }
        if not items:
            return []
        limit = None if self.timeout_s is None else self.timeout_s * len(items)
        [result] = self.run_scorer([call], timeout_s=limit)
        if result.status == TIMEOUT:
            message = (
                f"the batch call ({len(items)} items × timeout_s={self.timeout_s}) returned nothing within {limit:g} s"
            )
            return [ScoreOutcome(0.0, TIMEOUT, message=message)] * len(items)
        if result.status != OK:
            return [ScoreOutcome(0.0, result.status, message=result.message)] * len(items)
        values = result.value
        if not isinstance(values, (list, tuple, np.ndarray)) or len(values) != len(items):
            message = f"batch scorer must return a list of {len(items)} results, got {type(values).__name__}" + (
                f" of length {len(values)}" if hasattr(values, "__len__") else ""
            )
            return [ScoreOutcome(0.0, ERROR, message=message)] * len(items)
        return [to_outcome(CallResult(OK, value)) for value in values]
