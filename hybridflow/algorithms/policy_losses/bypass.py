"""Bypass mode: train directly against the rollout policy's log-probs (no old-log-prob pass).

The trainer skips recomputing ℓ_old and passes the rollout engine's log-probs as
``old_log_prob``. The rollout-correction settings (``policy_loss.rollout_correction.*``) then
give importance weights w = π_θ / π_rollout and a rejection mask
(:mod:`hybridflow.algorithms.rollout_correction`), and ``loss_type`` picks the objective:

* ``ppo_clip`` (default): the vanilla dual-clip loss on ρ = π_θ / π_rollout with the rejection
  mask; the IS weights are *not* multiplied in (the ratio already is the IS correction).
* ``reinforce``: −A · ℓ · w with the truncated, detached w (1 when ``rollout_is`` is None),
  aggregated over the rejection-filtered mask.
"""

from __future__ import annotations

import torch

from hybridflow.algorithms.aggregation import GlobalBatchInfo, agg_loss_with_info
from hybridflow.algorithms.policy_losses.ppo import ppo_clip_losses
from hybridflow.algorithms.policy_losses.registry import (
    PolicyLossSpec,
    apply_is_weights,
    pg_metrics,
    ppo_kl,
    register_policy_loss,
    zero_metric,
)
from hybridflow.algorithms.rollout_correction import compute_rollout_correction

BYPASS_LOSS_TYPES: tuple[str, ...] = ("ppo_clip", "reinforce")


def compute_policy_loss_reinforce(
    rollout_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "seq-mean-token-sum",
    *,
    rollout_is_weights: torch.Tensor | None = None,
    global_batch_info: GlobalBatchInfo | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """REINFORCE with optional IS correction: loss = −A · ℓ · sg(w) (w = 1 if None).

    ``actor/ppo_kl`` reports masked_mean(ℓ_rollout − ℓ); clip fractions are 0.
    """
    weights = None if rollout_is_weights is None else rollout_is_weights.detach()
    pg_losses = apply_is_weights(-advantages * log_prob, weights)
    loss = agg_loss_with_info(pg_losses, response_mask, loss_agg_mode, global_batch_info)
    kl = ppo_kl(log_prob - rollout_log_prob, response_mask)
    return loss, pg_metrics(zero_metric(loss), kl, zero_metric(loss))


@register_policy_loss(
    "bypass_mode",
    PolicyLossSpec(
        params=(
            "clip_ratio_low",
            "clip_ratio_high",
            "clip_ratio_c",
            "loss_type",
            "rollout_is",
            "rollout_is_threshold",
            "rollout_is_batch_normalize",
            "rollout_rs",
            "rollout_rs_threshold",
        )
    ),
)
def compute_policy_loss_bypass_mode(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    *,
    clip_ratio_low: float = 0.2,
    clip_ratio_high: float = 0.2,
    clip_ratio_c: float = 3.0,
    loss_type: str = "ppo_clip",
    rollout_is: str | None = None,
    rollout_is_threshold: float | str = 2.0,
    rollout_is_batch_normalize: bool = False,
    rollout_rs: str | None = None,
    rollout_rs_threshold: float | str | None = None,
    rollout_is_weights: torch.Tensor | None = None,
    global_batch_info: GlobalBatchInfo | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Bypass-mode loss; ``old_log_prob`` holds the rollout log-probs (module docstring).

    The IS weights are computed here from (ℓ, ℓ_rollout); a ``rollout_is_weights`` argument is
    ignored, as in verl. ``rollout_is_batch_normalize`` normalises over this call's tokens only,
    so it is not micro-batch invariant. Metrics add the ``rollout_corr/*`` diagnostics.
    """
    if loss_type not in BYPASS_LOSS_TYPES:
        raise ValueError(f"unknown rollout_correction.loss_type {loss_type!r}; valid: {', '.join(BYPASS_LOSS_TYPES)}")
    with torch.no_grad():
        weights, mask, corr_metrics = compute_rollout_correction(
            log_prob.detach(), old_log_prob, response_mask,
            rollout_is=rollout_is, rollout_is_threshold=rollout_is_threshold,
            rollout_is_batch_normalize=rollout_is_batch_normalize,
            rollout_rs=rollout_rs, rollout_rs_threshold=rollout_rs_threshold,
        )  # fmt: skip
    if loss_type == "reinforce":
        loss, metrics = compute_policy_loss_reinforce(
            old_log_prob, log_prob, advantages, mask, loss_agg_mode,
            rollout_is_weights=weights, global_batch_info=global_batch_info,
        )  # fmt: skip
    else:
        pg_losses, metrics = ppo_clip_losses(
            old_log_prob, log_prob, advantages, mask, clip_ratio_low, clip_ratio_high, clip_ratio_c
        )
        loss = agg_loss_with_info(pg_losses, mask, loss_agg_mode, global_batch_info)
    return loss, {**metrics, **corr_metrics}
