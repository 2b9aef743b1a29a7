"""Which attention kernel a model runs: ``model.attn_implementation`` (auto, eager or sdpa).

On CPU, torch's SDPA kernel is slow for short sequences. SmolLM2-135M, 8 rows, bf16 autocast,
forward + backward (2 cores, quiet machine): 110 tokens — eager 1.54 s vs SDPA 1.90 s;
256 tokens — 2.89 s vs 3.40 s; 512 tokens — 13.2 s vs 7.7 s, because eager attention
materialises the (rows × heads × L × L) score matrix. ``auto`` therefore picks eager on CPU
when a row holds at most :data:`EAGER_MAX_TOKENS` tokens, and SDPA everywhere else (on GPU SDPA
dispatches to fused flash / memory-efficient kernels). Both compute the same attention.
"""

from __future__ import annotations

import torch

from hybridflow.config import ActorRolloutRefConfig
from hybridflow.models.packed_attention import packed_name

ATTN_IMPLEMENTATIONS = ("auto", "eager", "sdpa")
EAGER_MAX_TOKENS = 256


def choose_attn_implementation(choice: str, device: str | torch.device, max_tokens: int | None) -> str:
    """The HF ``attn_implementation`` for ``choice`` on ``device`` with rows of ≤ ``max_tokens``
    tokens (``None``: unknown, so ``auto`` keeps SDPA)."""
    if choice not in ATTN_IMPLEMENTATIONS:
        raise ValueError(f"unknown attn_implementation {choice!r}; valid: {', '.join(ATTN_IMPLEMENTATIONS)}")
    if choice != "auto":
        return choice
    on_cpu = torch.device(device).type == "cpu"
    return "eager" if on_cpu and max_tokens is not None and max_tokens <= EAGER_MAX_TOKENS else "sdpa"


def policy_attn_implementation(config: ActorRolloutRefConfig, device: str | torch.device) -> str:
    """:func:`choose_attn_implementation` for the policy's workers (actor, reference, rollout):
    a row holds at most ``rollout.prompt_length + rollout.response_length`` tokens."""
    rollout = config.rollout
    max_tokens = (
        None
        if rollout.prompt_length is None or rollout.response_length is None
        else (rollout.prompt_length + rollout.response_length)
    )
    base = choose_attn_implementation(config.model.attn_implementation, device, max_tokens)
    return packed_name(base) if config.model.use_remove_padding else base
