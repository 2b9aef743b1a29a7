"""PF-PPO reweighting: resample the batch towards reliable (high |score|) rows after GAE.

Policy Filtration for RLHF (Zhang et al. 2024, arXiv 2409.06957). Enabled by
``algorithm.use_pf_ppo``; ``algorithm.pf_ppo.reweight_method`` and ``algorithm.pf_ppo.weight_pow``
choose the weights. The function returns row indices; the trainer applies them to every
column of the batch (``batch[indices]``), which keeps this module free of DataProto.
"""

from __future__ import annotations

import torch

PF_PPO_REWEIGHT_METHODS: tuple[str, ...] = ("pow", "max_min", "max_random")


def pf_ppo_weights(scores: torch.Tensor, reweight_method: str, weight_pow: float = 2.0) -> torch.Tensor:
    """Unnormalised sampling weights (B,) from row scores s (B,).

    * ``pow``:        |s|^p
    * ``max_min``:    1 for rows whose score is the batch max or min, else 0
    * ``max_random``: 0.4 for rows at the batch max, else 0.1
    """
    if reweight_method == "pow":
        return torch.abs(scores) ** weight_pow
    if reweight_method == "max_min":
        extreme = (scores == scores.max()) | (scores == scores.min())
        return extreme.to(scores.dtype)
    if reweight_method == "max_random":
        return torch.where(scores == scores.max(), 0.4, 0.1).to(scores.dtype)
    raise ValueError(
        f"unknown algorithm.pf_ppo.reweight_method {reweight_method!r}; valid: {', '.join(PF_PPO_REWEIGHT_METHODS)}"
    )


@torch.no_grad()
def compute_pf_ppo_reweight_indices(
    token_level_scores: torch.Tensor,
    reweight_method: str = "pow",
    weight_pow: float = 2.0,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Row indices (B,) drawn with replacement, P(i) ∝ max(weight_i + 1e-8, 1e-8).

    ``token_level_scores`` (B, T) are summed per row to s_i. ``generator`` makes the draw
    reproducible (None = torch's global RNG, as verl uses).
    """
    scores = token_level_scores.sum(dim=-1)
    weights = torch.clamp(pf_ppo_weights(scores, reweight_method, weight_pow) + 1e-8, min=1e-8)
    return torch.multinomial(weights, scores.shape[0], replacement=True, generator=generator)
