"""The actor objective for one micro-batch.

    L = pg_loss − entropy_coeff · agg(H) + kl_loss_coef · agg(KL_{kl_loss_type}(ℓ, ℓ_ref))
        [+ distillation_loss_coef · agg(D(ℓ, ℓ_teacher))]   (distillation as a loss term)

pg_loss comes from the policy-loss registry; every term is aggregated with the normalisers
of the whole mini-batch (:class:`GlobalBatchInfo`), so summing micro-batch losses gives the
mini-batch loss and gradients do not depend on the micro-batch split.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch
from tensordict import TensorDict

from hybridflow import fields as FK
from hybridflow.algorithms.aggregation import GlobalBatchInfo, agg_loss_with_info
from hybridflow.algorithms.kl import kl_penalty
from hybridflow.algorithms.policy_losses import get_policy_loss_fn, select_policy_loss_params
from hybridflow.config import ActorConfig
from hybridflow.workers.distillation_term import ADDITIVE_DISTILL_METRICS, DistillationTerm
from hybridflow.workers.ppo_loop import NUM_TOKENS_KEY, response_mask_of

# Metrics that are a micro-batch's share of a mini-batch loss (summed over micro-batches).
ADDITIVE_ACTOR_METRICS = (
    frozenset({"actor/pg_loss", "actor/entropy", "actor/kl_loss", "actor/loss"}) | ADDITIVE_DISTILL_METRICS
)


def policy_loss_scalars(actor: ActorConfig) -> dict[str, object]:
    """Every scalar a registered policy loss may take, named after its config key."""
    pl = actor.policy_loss
    rc = pl.rollout_correction
    low = actor.clip_ratio_low if actor.clip_ratio_low is not None else actor.clip_ratio
    high = actor.clip_ratio_high if actor.clip_ratio_high is not None else actor.clip_ratio
    return {
        "clip_ratio_low": low,
        "clip_ratio_high": high,
        "clip_ratio_c": actor.clip_ratio_c,
        "clip_cov_ratio": pl.clip_cov_ratio,
        "clip_cov_lb": pl.clip_cov_lb,
        "clip_cov_ub": pl.clip_cov_ub,
        "kl_cov_ratio": pl.kl_cov_ratio,
        "ppo_kl_coef": pl.ppo_kl_coef,
        "dro_beta": pl.dro_beta,
        "tau_pos": pl.tau_pos,
        "tau_neg": pl.tau_neg,
        "loss_type": rc.loss_type,
        "rollout_is": rc.rollout_is,
        "rollout_is_threshold": rc.rollout_is_threshold,
        "rollout_is_batch_normalize": rc.rollout_is_batch_normalize,
        "rollout_rs": rc.rollout_rs,
        "rollout_rs_threshold": rc.rollout_rs_threshold,
    }


@dataclass(frozen=True)
class ActorLoss:
    """``loss_fn(outputs, micro) -> (loss, metrics)`` for :meth:`TrainEngine.forward_backward`.

    ``use_stored_old_log_probs=False`` is the on-policy shortcut: ℓ_old = sg(ℓ).
    """

    loss_mode: str
    loss_agg_mode: str
    loss_params: Mapping[str, object]
    entropy_coeff: float
    use_kl_loss: bool
    kl_loss_coef: float
    kl_loss_type: str
    batch_info: GlobalBatchInfo
    use_stored_old_log_probs: bool
    distill: DistillationTerm | None = None

    @classmethod
    def from_config(
        cls,
        actor: ActorConfig,
        batch_info: GlobalBatchInfo,
        use_stored_old_log_probs: bool,
        distill: DistillationTerm | None = None,
    ) -> ActorLoss:
        mode = actor.policy_loss.loss_mode
        return cls(
            loss_mode=mode,
            loss_agg_mode=actor.loss_agg_mode,
            loss_params=select_policy_loss_params(mode, policy_loss_scalars(actor)),
            entropy_coeff=actor.entropy_coeff,
            use_kl_loss=actor.use_kl_loss,
            kl_loss_coef=actor.kl_loss_coef,
            kl_loss_type=actor.kl_loss_type,
            batch_info=batch_info,
            use_stored_old_log_probs=use_stored_old_log_probs,
            distill=distill,
        )

    @property
    def needs_entropy(self) -> bool:
        return self.entropy_coeff != 0.0

    def __call__(
        self, outputs: dict[str, torch.Tensor], micro: TensorDict
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        log_prob = outputs["log_probs"]
        mask = response_mask_of(micro).to(log_prob.dtype)
        old = micro[FK.OLD_LOG_PROBS] if self.use_stored_old_log_probs else log_prob.detach()
        weights = micro[FK.ROLLOUT_IS_WEIGHTS] if FK.ROLLOUT_IS_WEIGHTS in micro.keys() else None
        pg_loss, pg_metrics = get_policy_loss_fn(self.loss_mode)(
            old,
            log_prob,
            micro[FK.ADVANTAGES],
            mask,
            self.loss_agg_mode,
            **self.loss_params,
            rollout_is_weights=weights,
            global_batch_info=self.batch_info,
        )
        loss = pg_loss
        metrics = {"actor/pg_loss": pg_loss.detach(), **pg_metrics, NUM_TOKENS_KEY: mask.sum().detach()}
        if "entropy" in outputs:
            entropy = agg_loss_with_info(outputs["entropy"], mask, self.loss_agg_mode, self.batch_info)
            if self.needs_entropy:
                loss = loss - self.entropy_coeff * entropy
            metrics["actor/entropy"] = entropy.detach()
        if self.use_kl_loss:
            kld = kl_penalty(log_prob, micro[FK.REF_LOG_PROB], self.kl_loss_type)
            kl_loss = agg_loss_with_info(kld, mask, self.loss_agg_mode, self.batch_info)
            loss = loss + self.kl_loss_coef * kl_loss
            metrics["actor/kl_loss"] = kl_loss.detach()
        if self.distill is not None:
            term, distill_metrics = self.distill(outputs, micro, mask, self.batch_info)
            loss = loss if term is None else loss + term
            metrics |= distill_metrics
        metrics["actor/loss"] = loss.detach()
        return loss, metrics
