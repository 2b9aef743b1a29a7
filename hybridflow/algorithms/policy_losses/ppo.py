"""Ratio-based policy losses: vanilla PPO (dual clip), GSPO, SAPO, GPG, CISPO, GMPO, DRO.

Notation: ℓ = log_prob (with gradient), ℓ_old = old_log_prob, A = advantages, m = response_mask,
all (B, T); δ = clamp(ℓ − ℓ_old, ±20), ρ = exp(δ); sg = stop-gradient; ε_low / ε_high =
``clip_ratio_low`` / ``clip_ratio_high``. Calling convention: :mod:`.registry`.
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
    zero_metric,
)
from hybridflow.algorithms.utils import masked_mean

CLIP_PARAMS = ("clip_ratio_low", "clip_ratio_high")


def ppo_clip_losses(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    clip_ratio_low: float,
    clip_ratio_high: float,
    clip_ratio_c: float,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Per-token dual-clip PPO losses (B, T) and the standard metrics (used by vanilla and bypass)."""
    check_clip_ratios(clip_ratio_low, clip_ratio_high)
    if clip_ratio_c <= 1.0:
        raise ValueError(f"clip_ratio_c (dual-clip bound) must be > 1.0, got {clip_ratio_c}")
    log_ratio = clamped_log_ratio(log_prob, old_log_prob)
    ratio = torch.exp(log_ratio)
    loss_unclipped = -advantages * ratio
    loss_clipped = -advantages * torch.clamp(ratio, 1 - clip_ratio_low, 1 + clip_ratio_high)
    clip_max = torch.maximum(loss_unclipped, loss_clipped)
    loss_dual = -advantages * clip_ratio_c
    pg_losses = torch.where(advantages < 0, torch.minimum(loss_dual, clip_max), clip_max)
    metrics = pg_metrics(
        masked_mean(torch.gt(loss_clipped, loss_unclipped).float(), response_mask),
        ppo_kl(log_ratio, response_mask),
        masked_mean((torch.gt(clip_max, loss_dual) & (advantages < 0)).float(), response_mask),
    )
    return pg_losses, metrics


@register_policy_loss("vanilla", PolicyLossSpec(params=(*CLIP_PARAMS, "clip_ratio_c")))
def compute_policy_loss_vanilla(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    *,
    clip_ratio_low: float = 0.2,
    clip_ratio_high: float = 0.2,
    clip_ratio_c: float = 3.0,
    rollout_is_weights: torch.Tensor | None = None,
    global_batch_info: GlobalBatchInfo | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PPO clip (Schulman et al. 2017, arXiv 1707.06347) with dual clip (Ye et al. 2019, arXiv 1912.09729).

    L1 = −A ρ;  L2 = −A clip(ρ, 1 − ε_low, 1 + ε_high);  C1 = max(L1, L2);  L3 = −A c
    (c = ``clip_ratio_c`` > 1);  loss_t = min(L3, C1) where A < 0, else C1; aggregated with
    ``loss_agg_mode``. pg_clipfrac = mean[L2 > L1]; pg_clipfrac_lower = mean[(C1 > L3)·(A < 0)].
    """
    pg_losses, metrics = ppo_clip_losses(
        old_log_prob, log_prob, advantages, response_mask, clip_ratio_low, clip_ratio_high, clip_ratio_c
    )
    pg_losses = apply_is_weights(pg_losses, rollout_is_weights)
    return agg_loss_with_info(pg_losses, response_mask, loss_agg_mode, global_batch_info), metrics


@register_policy_loss("gspo", PolicyLossSpec(params=CLIP_PARAMS))
def compute_policy_loss_gspo(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "seq-mean-token-mean",
    *,
    clip_ratio_low: float = 0.2,
    clip_ratio_high: float = 0.2,
    rollout_is_weights: torch.Tensor | None = None,
    global_batch_info: GlobalBatchInfo | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """GSPO, sequence-level ratio (Zheng et al. 2025, arXiv 2507.18071).

    ŝ_i = Σ_t (ℓ − ℓ_old) m / max(|y_i|, 1);  r_it = exp(min(ℓ_t − sg(ℓ_t) + sg(ŝ_i), 10)) (value
    = the sequence ratio, gradient = the token's); loss = max(−A r, −A clip(r, 1 − ε_low,
    1 + ε_high)), always aggregated with ``seq-mean-token-mean`` (``loss_agg_mode`` is ignored,
    as in verl). pg_clipfrac_lower is 0.
    """
    check_clip_ratios(clip_ratio_low, clip_ratio_high)
    log_ratio = log_prob - old_log_prob
    seq_lengths = response_mask.sum(dim=-1).clamp(min=1)
    seq_log_ratio = (log_ratio * response_mask).sum(dim=-1) / seq_lengths
    log_seq_ratio = log_prob - log_prob.detach() + seq_log_ratio.detach().unsqueeze(-1)
    seq_ratio = torch.exp(torch.clamp(log_seq_ratio, max=10.0))
    loss_unclipped = -advantages * seq_ratio
    loss_clipped = -advantages * torch.clamp(seq_ratio, 1 - clip_ratio_low, 1 + clip_ratio_high)
    pg_losses = apply_is_weights(torch.maximum(loss_unclipped, loss_clipped), rollout_is_weights)
    loss = agg_loss_with_info(pg_losses, response_mask, "seq-mean-token-mean", global_batch_info)
    metrics = pg_metrics(
        masked_mean(torch.gt(loss_clipped, loss_unclipped).float(), response_mask),
        ppo_kl(log_ratio, response_mask),
        zero_metric(loss),
    )
    return loss, metrics


@register_policy_loss("sapo", PolicyLossSpec(params=("tau_pos", "tau_neg")))
def compute_policy_loss_sapo(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "seq-mean-token-mean",
    *,
    tau_pos: float = 1.0,
    tau_neg: float = 1.05,
    rollout_is_weights: torch.Tensor | None = None,
    global_batch_info: GlobalBatchInfo | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """SAPO, soft adaptive gate instead of a hard clip (Gao et al. 2025, arXiv 2511.20347).

    f(ρ) = σ(τ (ρ − 1)) · 4/τ with τ = ``tau_pos`` where A > 0, else ``tau_neg``;
    loss = −f(ρ) A, aggregated with ``seq-mean-token-mean`` (``loss_agg_mode`` ignored, as in
    verl). Both clip fractions are 0.
    """
    if tau_pos <= 0 or tau_neg <= 0:
        raise ValueError(f"tau_pos and tau_neg must be > 0, got {tau_pos} / {tau_neg}")
    log_ratio = clamped_log_ratio(log_prob, old_log_prob)
    ratio = torch.exp(log_ratio)
    taus = torch.where(
        advantages > 0,
        torch.as_tensor(tau_pos, dtype=advantages.dtype, device=advantages.device),
        torch.as_tensor(tau_neg, dtype=advantages.dtype, device=advantages.device),
    )
    gates = torch.sigmoid(taus * (ratio - 1.0)) * (4.0 / taus)
    pg_losses = apply_is_weights(-gates * advantages, rollout_is_weights)
    loss = agg_loss_with_info(pg_losses, response_mask, "seq-mean-token-mean", global_batch_info)
    return loss, pg_metrics(zero_metric(loss), ppo_kl(log_ratio, response_mask), zero_metric(loss))


@register_policy_loss("gpg")
def compute_policy_loss_gpg(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    *,
    rollout_is_weights: torch.Tensor | None = None,
    global_batch_info: GlobalBatchInfo | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """GPG, plain policy gradient without ratio or clip (Chu et al. 2025, arXiv 2504.02546).

    loss = −ℓ A, aggregated with ``loss_agg_mode``. Clip fractions are 0; ppo_kl is reported.
    """
    pg_losses = apply_is_weights(-log_prob * advantages, rollout_is_weights)
    loss = agg_loss_with_info(pg_losses, response_mask, loss_agg_mode, global_batch_info)
    log_ratio = clamped_log_ratio(log_prob, old_log_prob)
    return loss, pg_metrics(zero_metric(loss), ppo_kl(log_ratio, response_mask), zero_metric(loss))


@register_policy_loss("cispo", PolicyLossSpec(params=CLIP_PARAMS))
def compute_policy_loss_cispo(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    *,
    clip_ratio_low: float = 0.2,
    clip_ratio_high: float = 0.2,
    rollout_is_weights: torch.Tensor | None = None,
    global_batch_info: GlobalBatchInfo | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """CISPO, clipped IS-weight policy optimisation (MiniMax 2025, arXiv 2506.13585).

    loss = −sg(clip(ρ, 1 − ε_low, 1 + ε_high)) · A · ℓ: every token keeps a gradient, only its
    weight is clipped. pg_clipfrac = mean[clip(ρ) ≠ ρ]; pg_clipfrac_lower = 0.
    """
    check_clip_ratios(clip_ratio_low, clip_ratio_high)
    log_ratio = clamped_log_ratio(log_prob, old_log_prob)
    ratio = torch.exp(log_ratio)
    clipped_ratio = torch.clamp(ratio, 1 - clip_ratio_low, 1 + clip_ratio_high)
    pg_losses = apply_is_weights(-clipped_ratio.detach() * advantages * log_prob, rollout_is_weights)
    loss = agg_loss_with_info(pg_losses, response_mask, loss_agg_mode, global_batch_info)
    clipfrac = masked_mean((ratio != clipped_ratio).float(), response_mask)
    return loss, pg_metrics(clipfrac, ppo_kl(log_ratio, response_mask), zero_metric(loss))


@register_policy_loss("geo_mean", PolicyLossSpec(params=CLIP_PARAMS))
def compute_policy_loss_geo_mean(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    *,
    clip_ratio_low: float = 0.2,
    clip_ratio_high: float = 0.2,
    rollout_is_weights: torch.Tensor | None = None,
    global_batch_info: GlobalBatchInfo | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """GMPO, geometric-mean policy optimisation (Zhao et al. 2025, arXiv 2507.20673).

    d = ℓ − ℓ_old (not clamped); d* = sgn(A) · min(sgn(A) d, sgn(A) clamp(d, −ε_low, ε_high));
    R_i = exp(Σ_t d* m / (Σ_t m + 1e-8));  Ā_i = Σ_t A m / (Σ_t m + 1e-8);  loss_i = −Ā_i R_i
    (× the geometric mean of the row's ``rollout_is_weights``). The loss is the mean of loss_i
    over the non-empty rows (``loss_agg_mode`` is ignored; verl's plain mean over all rows gives
    the same value unless a row is empty). pg_clipfrac / pg_clipfrac_lower = mean[d clipped]
    where A > 0 / A < 0.
    """
    check_clip_ratios(clip_ratio_low, clip_ratio_high)
    log_ratio = log_prob - old_log_prob
    sign = torch.sign(advantages)
    log_ratio_clamped = torch.clamp(log_ratio, -clip_ratio_low, clip_ratio_high)
    log_ratio_min = sign * torch.minimum(sign * log_ratio, sign * log_ratio_clamped)
    lengths = response_mask.sum(dim=-1)
    seq_ratio = torch.exp((log_ratio_min * response_mask).sum(dim=-1) / (lengths + 1e-8))
    seq_advantage = (advantages * response_mask).sum(dim=-1) / (lengths + 1e-8)
    seq_losses = -seq_advantage * seq_ratio
    if rollout_is_weights is not None:
        log_w = (torch.log(rollout_is_weights + 1e-10) * response_mask).sum(dim=-1) / (lengths + 1e-8)
        seq_losses = seq_losses * torch.exp(log_w)
    seq_valid = (lengths > 0).to(seq_losses.dtype).unsqueeze(-1)
    loss = agg_loss_with_info(seq_losses.unsqueeze(-1), seq_valid, "seq-mean-token-sum", global_batch_info)
    clipped = torch.ne(log_ratio, log_ratio_clamped)
    metrics = pg_metrics(
        masked_mean((clipped & (advantages > 0)).float(), response_mask),
        ppo_kl(log_ratio, response_mask),
        masked_mean((clipped & (advantages < 0)).float(), response_mask),
    )
    return loss, metrics


@register_policy_loss("dro", PolicyLossSpec(params=("dro_beta",)))
def compute_policy_loss_dro(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    *,
    dro_beta: float = 0.1,
    rollout_is_weights: torch.Tensor | None = None,
    global_batch_info: GlobalBatchInfo | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """DRO, quadratic log-ratio penalty instead of a clip (Richemond et al. 2024, arXiv 2405.19107;
    Kimi k1.5, arXiv 2501.12599).

    loss = −(ℓ A − ½ β (ℓ − ℓ_old)²), β = ``policy_loss.dro_beta`` > 0 (ValueError otherwise),
    aggregated with ``loss_agg_mode``. Clip fractions are 0.
    """
    if dro_beta <= 0:
        raise ValueError(f"policy_loss.dro_beta must be > 0, got {dro_beta}")
    log_ratio = log_prob - old_log_prob
    pg_losses = -(log_prob * advantages - 0.5 * dro_beta * log_ratio**2)
    pg_losses = apply_is_weights(pg_losses, rollout_is_weights)
    loss = agg_loss_with_info(pg_losses, response_mask, loss_agg_mode, global_batch_info)
    return loss, pg_metrics(zero_metric(loss), ppo_kl(log_ratio, response_mask), zero_metric(loss))
