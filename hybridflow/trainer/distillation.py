"""Phase 6b of a distillation run: the task advantage weighted, and the teacher's per-token
reward folded in (see :mod:`hybridflow.algorithms.distillation`)."""

from __future__ import annotations

from hybridflow import fields as F
from hybridflow.algorithms.distillation import fold_distillation_advantage
from hybridflow.config.distillation import DistillationConfig
from hybridflow.protocol import DataProto


def distill_advantages(batch: DataProto, dist: DistillationConfig) -> dict[str, float]:
    """In place: ``advantages`` ← w·A (as a loss term), or w·A − c·D(ℓ_old, ℓ_teacher) per token
    (``use_policy_gradient``). Returns ``distill/token_reward_mean`` when folded."""
    td, loss = batch.require_batch(), dist.distillation_loss
    assert dist.reward_weight is not None  # resolved at load (resolve_distillation): never null here
    weight = float(dist.reward_weight)
    if not loss.use_policy_gradient:
        if weight != 1.0:
            td[F.ADVANTAGES] = td[F.ADVANTAGES] * weight
        return {}
    mask = td[F.RESPONSE_MASK]
    task = td[F.ADVANTAGES]
    folded = fold_distillation_advantage(
        task,
        td[F.OLD_LOG_PROBS],
        td[F.TEACHER_LOG_PROB],
        mask,
        loss.loss_mode,
        weight,
        loss.distillation_loss_coef,
        loss.log_prob_min_clamp,
        loss.loss_max_clamp,
    )
    td[F.ADVANTAGES] = folded
    tokens = mask.bool()
    reward = (folded - weight * task)[tokens]
    return {"distill/token_reward_mean": reward.mean().item() if reward.numel() else 0.0}
