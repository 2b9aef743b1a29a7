"""Rotary positions of response tokens after left-padded prompts, text-only or 3-D (Qwen2-VL).

One rule for every producer of rollout batches (the plain sampler, the agent loops' collate):
response tokens are text, so they continue from the prompt's last position (text prompts) or
from the prompt's largest position on all three axes (prompts with images, whose image tokens
take fewer positions than tokens) — what transformers' ``get_rope_index`` gives text after the
prompt, and so what the actor's forward must see.
"""

from __future__ import annotations

import torch


def response_positions(prompt_pos: torch.Tensor, steps: int) -> torch.Tensor:
    """The positions of ``steps`` response tokens after left-padded prompts: (B, P) → (B, T),
    the last prompt position + 1, + 2, …; per-axis (B, 3, P) → (B, 3, T), the row's largest
    prompt position + 1, + 2, … on every axis (response tokens are text)."""
    delta = torch.arange(1, steps + 1, device=prompt_pos.device, dtype=prompt_pos.dtype)
    if prompt_pos.dim() == 2:
        return prompt_pos[:, -1:] + delta[None]
    start = prompt_pos.amax(dim=(1, 2))
    return (start[:, None] + delta[None])[:, None, :].expand(-1, prompt_pos.shape[1], -1)
