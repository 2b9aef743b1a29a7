"""Clip-Cov and KL-Cov: control entropy collapse by acting on the tokens with the largest
covariance between advantage and log-prob (Cui et al. 2025, arXiv 2505.22617).

cov_t = (A_t − Ā)(ℓ_t − ℓ̄), means over the valid tokens of the batch. Both losses need the
number of valid tokens on the host (a top-k size / a random draw), an unavoidable sync.
"""

from __future__ import annotations

import torch

from hybridflow.algorithms.aggregation import GlobalBatchInfo, agg_loss_with_info
from hybridflow.algorithms.policy_losses.registry import (
    PolicyLossSpec,
    apply_is_weights,
    check_clip_ratios,
    pg_metrics,
    ppo_kl,
    register_policy_loss,
    zero_metric,
)
from hybridflow.algorithms.utils import masked_mean


@register_policy_loss(
    "clip_cov",
    PolicyLossSpec(params=("clip_ratio_low", "clip_ratio_high", "clip_cov_ratio", "clip_cov_lb", "clip_cov_ub")),
)
def compute_policy_loss_clip_cov(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    *,
    clip_ratio_low: float = 0.2,
    clip_ratio_high: float = 0.2,
    clip_cov_ratio: float = 0.0002,
    clip_cov_lb: float = 1.0,
    clip_cov_ub: float = 5.0,
    generator: torch.Generator | None = None,
    rollout_is_weights: torch.Tensor | None = None,
    global_batch_info: GlobalBatchInfo | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Clip-Cov: PPO clip without dual clip, plus zeroing the loss of a few random high-cov tokens.

    ρ = exp(ℓ − ℓ_old) (unclamped); L1 = −A ρ, L2 = −A clip(ρ, 1 − ε_low, 1 + ε_high).
    Candidates: valid tokens not already clipped (L2 ≤ L1) with lb < cov < ub; pick
    k = max(⌊clip_cov_ratio · N_valid⌋, 1) of them uniformly at random (``generator``; None =
    torch's global RNG, as verl) and set their loss to 0 (corr = 0); loss = max(L1, L2) · corr.
    pg_clipfrac = fraction of valid tokens with corr = 0.
    """
    check_clip_ratios(clip_ratio_low, clip_ratio_high)
    if clip_cov_ratio <= 0:
        raise ValueError(f"policy_loss.clip_cov_ratio must be > 0, got {clip_cov_ratio}")
    log_ratio = log_prob - old_log_prob
    ratio = torch.exp(log_ratio)
    loss_unclipped = -advantages * ratio
    loss_clipped = -advantages * torch.clamp(ratio, 1 - clip_ratio_low, 1 + clip_ratio_high)
    valid = response_mask > 0
    clipped_already = (loss_clipped > loss_unclipped) & valid
    with torch.no_grad():
        cov = (advantages - masked_mean(advantages, response_mask)) * (log_prob - masked_mean(log_prob, response_mask))
        candidates = (cov > clip_cov_lb) & (cov < clip_cov_ub) & valid & ~clipped_already
        candidate_idx = torch.nonzero(candidates)
        corr = torch.ones_like(advantages)
        if candidate_idx.shape[0] > 0:
            num_pick = max(int(clip_cov_ratio * int(valid.sum())), 1)
            perm = torch.randperm(candidate_idx.shape[0], generator=generator).to(candidate_idx.device)
            picked = candidate_idx[perm[:num_pick]]
            corr[picked[:, 0], picked[:, 1]] = 0.0
    pg_losses = apply_is_weights(torch.maximum(loss_unclipped, loss_clipped) * corr, rollout_is_weights)
    loss = agg_loss_with_info(pg_losses, response_mask, loss_agg_mode, global_batch_info)
    clipfrac = masked_mean((corr == 0).float(), response_mask)
    return loss, pg_metrics(clipfrac, ppo_kl(log_ratio, response_mask), zero_metric(loss))


@register_policy_loss("kl_cov", PolicyLossSpec(params=("kl_cov_ratio", "ppo_kl_coef")))
def compute_policy_loss_kl_cov(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    *,
    kl_cov_ratio: float = 0.0002,
    ppo_kl_coef: float = 0.1,
    rollout_is_weights: torch.Tensor | None = None,
    global_batch_info: GlobalBatchInfo | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """KL-Cov: a |ℓ − ℓ_old| penalty on the top-k covariance tokens.

    ρ = exp(ℓ − ℓ_old) (unclamped); loss = −A ρ, except the k = max(1, ⌊kl_cov_ratio · N_valid⌋)
    valid tokens with the largest cov get −A ρ + κ |ℓ − ℓ_old| (κ = ``ppo_kl_coef``). The
    selection is a deterministic top-k (no randomness, so no generator). As in verl, ``actor/ppo_kl``
    reports masked_mean(|ℓ − ℓ_old|) here; clip fractions are 0.
    """
    if kl_cov_ratio <= 0:
        raise ValueError(f"policy_loss.kl_cov_ratio must be > 0, got {kl_cov_ratio}")
    log_ratio = log_prob - old_log_prob
    abs_kl = log_ratio.abs()
    ratio = torch.exp(log_ratio)
    pg_losses = -advantages * ratio
    valid = response_mask > 0
    with torch.no_grad():
        flat_valid = torch.nonzero(valid.reshape(-1), as_tuple=True)[0]
        selected = torch.zeros(valid.numel(), dtype=torch.bool, device=valid.device)
        if flat_valid.numel() > 0:
            adv_valid = advantages.reshape(-1)[flat_valid]
            logp_valid = log_prob.detach().reshape(-1)[flat_valid]
            cov = (adv_valid - adv_valid.mean()) * (logp_valid - logp_valid.mean())
            k = max(1, int(flat_valid.numel() * kl_cov_ratio))
            selected[flat_valid[torch.topk(cov, k, largest=True).indices]] = True
        selected = selected.reshape(valid.shape)
    pg_losses = torch.where(selected, pg_losses + ppo_kl_coef * abs_kl, pg_losses)
    pg_losses = apply_is_weights(pg_losses, rollout_is_weights)
    loss = agg_loss_with_info(pg_losses, response_mask, loss_agg_mode, global_batch_info)
    return loss, pg_metrics(zero_metric(loss), masked_mean(abs_kl, response_mask), zero_metric(loss))
