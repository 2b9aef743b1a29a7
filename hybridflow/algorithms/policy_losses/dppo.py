"""DPPO: trust region by a divergence between the token's old and new probability instead of a
ratio clip (arXiv 2602.04879). Two divergences: total variation (``dppo_tv``) and binary KL
(``dppo_kl``).

Here ``clip_ratio_low`` / ``clip_ratio_high`` are divergence thresholds δ_low / δ_high, and
``clip_ratio_c`` is the truncation c of the importance weight w = sg(min(ρ, c)) (the paper uses a
large c such as 20; the actor passes its configured ``clip_ratio_c``). With p = exp(ℓ),
p_old = exp(ℓ_old), a token is kept (v = 1) when its update stays inside the trust region in the
direction its advantage pushes it; loss = −A · w · ℓ · v. pg_clipfrac = mean(1 − v),
pg_clipfrac_lower = mean[ρ > c] · v.
"""

from __future__ import annotations

import torch

from hybridflow.algorithms.aggregation import GlobalBatchInfo, agg_loss_with_info
from hybridflow.algorithms.policy_losses.registry import (
    PolicyLossSpec,
    apply_is_weights,
    check_clip_ratios,
    clamped_log_ratio,
    pg_metrics,
    ppo_kl,
    register_policy_loss,
)
from hybridflow.algorithms.utils import masked_mean

DPPO_SPEC = PolicyLossSpec(params=("clip_ratio_low", "clip_ratio_high", "clip_ratio_c"))


def _dppo_loss(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    keep: torch.Tensor,
    clip_ratio_c: float,
    rollout_is_weights: torch.Tensor | None,
    loss_agg_mode: str,
    global_batch_info: GlobalBatchInfo | None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    log_ratio = clamped_log_ratio(log_prob, old_log_prob)
    ratio = torch.exp(log_ratio)
    truncated = torch.clamp(ratio, max=clip_ratio_c).detach()
    keep = keep.detach().to(log_prob.dtype)
    pg_losses = apply_is_weights(-advantages * truncated * log_prob * keep, rollout_is_weights)
    loss = agg_loss_with_info(pg_losses, response_mask, loss_agg_mode, global_batch_info)
    metrics = pg_metrics(
        masked_mean(1.0 - keep, response_mask),
        ppo_kl(log_ratio, response_mask),
        masked_mean((ratio > clip_ratio_c).to(keep.dtype) * keep, response_mask),
    )
    return loss, metrics


@register_policy_loss("dppo_tv", DPPO_SPEC)
def compute_policy_loss_dppo_tv(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    *,
    clip_ratio_low: float = 0.2,
    clip_ratio_high: float = 0.2,
    clip_ratio_c: float = 20.0,
    rollout_is_weights: torch.Tensor | None = None,
    global_batch_info: GlobalBatchInfo | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """DPPO-Binary-TV: v = [p − p_old ≤ δ_high] where A > 0, v = [p − p_old ≥ −δ_low] where A ≤ 0."""
    check_clip_ratios(clip_ratio_low, clip_ratio_high)
    prob_change = torch.exp(log_prob) - torch.exp(old_log_prob)
    keep = torch.where(advantages > 0, prob_change <= clip_ratio_high, prob_change >= -clip_ratio_low)
    return _dppo_loss(
        old_log_prob, log_prob, advantages, response_mask, keep, clip_ratio_c,
        rollout_is_weights, loss_agg_mode, global_batch_info,
    )  # fmt: skip


@register_policy_loss("dppo_kl", DPPO_SPEC)
def compute_policy_loss_dppo_kl(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    *,
    clip_ratio_low: float = 0.2,
    clip_ratio_high: float = 0.2,
    clip_ratio_c: float = 20.0,
    rollout_is_weights: torch.Tensor | None = None,
    global_batch_info: GlobalBatchInfo | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """DPPO-Binary-KL with b = p_old (ℓ_old − ℓ) + (1 − p_old) log((1 − p_old + 1e-8)/(1 − p + 1e-8)):

    v = [b ≤ δ_high or p ≤ p_old] where A > 0, v = [b ≤ δ_low or p ≥ p_old] where A ≤ 0.
    """
    check_clip_ratios(clip_ratio_low, clip_ratio_high)
    prob = torch.exp(log_prob)
    old_prob = torch.exp(old_log_prob)
    binary_kl = old_prob * (old_log_prob - log_prob) + (1 - old_prob) * torch.log(
        (1.0 - old_prob + 1e-8) / (1.0 - prob + 1e-8)
    )
    keep_positive = (binary_kl <= clip_ratio_high) | (prob <= old_prob)
    keep_negative = (binary_kl <= clip_ratio_low) | (prob >= old_prob)
    keep = torch.where(advantages > 0, keep_positive, keep_negative)
    return _dppo_loss(
        old_log_prob, log_prob, advantages, response_mask, keep, clip_ratio_c,
        rollout_is_weights, loss_agg_mode, global_batch_info,
    )  # fmt: skip
