"""The ``dapo`` reward manager: per-item scores plus DAPO's soft overlong penalty.

DAPO (Yu et al., 2025, arXiv 2503.14476), "overlong reward shaping": with
``expected = max_resp_len - buffer_len``, a response of ``L`` tokens gets

    penalty = min(-(L - expected) / buffer_len * penalty_factor, 0)

i.e. 0 up to ``expected`` tokens, falling linearly to ``-penalty_factor`` at ``max_resp_len``.
The reward is ``score + penalty``; an item whose scoring failed gets 0 with no penalty.
"""

from __future__ import annotations

from typing import Any

import torch

from hybridflow.reward.base import REWARD_MANAGERS, RewardManager, ScoreItem
from hybridflow.reward.executors import OK
from hybridflow.reward.outcomes import ScoreOutcome


def overlong_penalty(
    response_lengths: torch.Tensor, max_resp_len: int, buffer_len: int, penalty_factor: float
) -> torch.Tensor:
    """``(B,)`` float penalties per the formula in the module docstring."""
    if buffer_len <= 0 or buffer_len > max_resp_len:
        raise ValueError(f"overlong buffer_len must be in 1..max_resp_len={max_resp_len}, got {buffer_len}")
    expected = max_resp_len - buffer_len
    excess = response_lengths.to(torch.float32) - expected
    return torch.clamp(-excess / buffer_len * penalty_factor, max=0.0)


@REWARD_MANAGERS.register("dapo")
class DAPORewardManager(RewardManager):
    """Naive scoring plus the overlong penalty when ``overlong_buffer_enable``; the other keyword
    arguments are :class:`RewardManager`'s.

    Extra args: ``max_resp_len`` (required when enabled), ``overlong_buffer_enable``,
    ``overlong_buffer_len``, ``overlong_penalty_factor``, ``overlong_buffer_log``. With
    ``overlong_buffer_log`` (verl's ``overlong_buffer.log``) the per-item ``overlong_reward``
    (the penalty) and ``overlong`` (1.0 where it is < 0) join the extra info, i.e. the logs.
    """

    def __init__(
        self,
        tokenizer: Any,
        *,
        max_resp_len: int | None = None,
        overlong_buffer_enable: bool = False,
        overlong_buffer_len: int = 0,
        overlong_penalty_factor: float = 1.0,
        overlong_buffer_log: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(tokenizer, **kwargs)
        if overlong_buffer_enable:
            if max_resp_len is None:
                raise ValueError("dapo reward manager: max_resp_len is required when overlong_buffer_enable is set")
            if not 0 < overlong_buffer_len <= max_resp_len:
                raise ValueError(
                    f"dapo reward manager: overlong_buffer_len must be in 1..max_resp_len={max_resp_len}, "
                    f"got {overlong_buffer_len}"
                )
        self.max_resp_len = max_resp_len
        self.overlong_buffer_enable = overlong_buffer_enable
        self.overlong_buffer_len = overlong_buffer_len
        self.overlong_penalty_factor = overlong_penalty_factor
        self.overlong_buffer_log = overlong_buffer_log

    def adjust(self, items: list[ScoreItem], outcomes: list[ScoreOutcome]) -> tuple[list[float], dict[str, list[Any]]]:
        scores = [o.score for o in outcomes]
        if not self.overlong_buffer_enable:
            return scores, {}
        assert self.max_resp_len is not None  # required with overlong_buffer_enable (checked in __init__)
        lengths = torch.tensor([it.response_length for it in items])
        penalties = overlong_penalty(
            lengths, self.max_resp_len, self.overlong_buffer_len, self.overlong_penalty_factor
        ).tolist()
        penalties = [p if o.status == OK else 0.0 for p, o in zip(penalties, outcomes)]
        final = [s + p for s, p in zip(scores, penalties)]
        if not self.overlong_buffer_log:
            return final, {}
        return final, {"overlong_reward": penalties, "overlong": [1.0 if p < 0 else 0.0 for p in penalties]}
