"""Rollout-vs-actor log-prob agreement: the ``rollout/actor_logprob_diff`` metrics.

The sampler's log-probs (``rollout_log_probs``) and the actor's recomputed ``old_log_probs``
should agree on every response token (fp32: within ~1e-5); a growing gap means the rollout
runs stale weights or different numerics, i.e. the update becomes off-policy.
"""

from __future__ import annotations

import torch

from hybridflow import fields as F

METRIC_MAX = "rollout/actor_logprob_diff"
METRIC_MEAN = "rollout/actor_logprob_diff_mean"


def actor_logprob_diff(
    rollout_log_probs: torch.Tensor, old_log_probs: torch.Tensor, response_mask: torch.Tensor
) -> dict[str, float]:
    """Max (``rollout/actor_logprob_diff``) and mean (``…_mean``) of |rollout − actor| over
    response tokens; inputs (B, T). With no response token at all both are 0.0."""
    if rollout_log_probs.shape != old_log_probs.shape or old_log_probs.shape != response_mask.shape:
        raise ValueError(
            f"shape mismatch: {F.ROLLOUT_LOG_PROBS} {tuple(rollout_log_probs.shape)}, "
            f"{F.OLD_LOG_PROBS} {tuple(old_log_probs.shape)}, {F.RESPONSE_MASK} {tuple(response_mask.shape)}"
        )
    mask = response_mask.bool()
    diff = (rollout_log_probs.double() - old_log_probs.double()).abs()[mask]
    if diff.numel() == 0:
        return {METRIC_MAX: 0.0, METRIC_MEAN: 0.0}
    return {METRIC_MAX: float(diff.max()), METRIC_MEAN: float(diff.mean())}
