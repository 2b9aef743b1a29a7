"""The prompt prefix that every row of a batch shares (system prompt, chat-template header).

Prompts of an RL batch usually start with the same tokens; the lean decoder runs them once
and lets every row attend to that single copy, so prefill work scales with the distinct part.
"""

from __future__ import annotations

import torch


def shared_prefix_length(input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor) -> int:
    """Number k of leading real tokens identical in every row, at positions 0 … k−1.

    Left-padded prompts (B, P). k stops one token short of the shortest prompt, so every row
    keeps at least one token of its own (the one whose logits start the response). Returns 0
    for a single row or when the rows differ from their first token.
    """
    rows = input_ids.shape[0]
    lengths = attention_mask.sum(dim=1)
    shortest = int(lengths.min())
    if rows < 2 or shortest < 2:
        return 0
    start = input_ids.shape[1] - lengths  # first real column of each row
    columns = start[:, None] + torch.arange(shortest - 1, device=input_ids.device)[None]
    tokens = input_ids.gather(1, columns)
    positions = position_ids.gather(1, columns)
    expected = torch.arange(shortest - 1, device=input_ids.device)[None]
    same = (tokens == tokens[:1]).all(dim=0) & (positions == expected).all(dim=0)
    differing = (~same).nonzero()
    return int(differing[0]) if differing.numel() else shortest - 1
