"""The actor's distillation term for one micro-batch (see :mod:`hybridflow.algorithms.distillation`).

As a loss (``use_policy_gradient=false``) it adds ``c · agg(D_t)`` to the actor's objective,
aggregated like every other term (``loss_agg_mode`` over the whole mini-batch). Folded into
the advantage (``use_policy_gradient=true``) it adds nothing here: the controller already put
−c·D_t(ℓ_old, ℓ_T) into the advantages. Either way it reports, over response tokens only:

* ``distill/kl``: mean of ℓ − ℓ_T (k1) under the current student: the per-token reverse
  KL(π_S ‖ π_T) estimated on the student's own samples;
* ``distill/teacher_logp``: mean ℓ_T, the teacher's log-prob of the student's tokens;
* ``distill/loss``: the aggregated divergence (as a loss only);
* ``distill/topk_teacher_mass`` / ``distill/topk_student_mass`` (top-K losses): the
  probability the teacher's top-K ids hold under the teacher and under the student (coverage).

Each metric is the micro-batch's share of a mini-batch token mean, so micro-batch values add up.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from tensordict import TensorDict

from hybridflow import fields as FK
from hybridflow.algorithms.aggregation import GlobalBatchInfo, agg_loss_with_info
from hybridflow.algorithms.distillation import sampled_token_divergence, topk_divergence, topk_mass, uses_topk
from hybridflow.config.distillation import DistillationConfig

ADDITIVE_DISTILL_METRICS = frozenset(
    {
        "distill/kl",
        "distill/teacher_logp",
        "distill/loss",
        "distill/topk_teacher_mass",
        "distill/topk_student_mass",
    }
)


@dataclass(frozen=True)
class DistillationTerm:
    loss_mode: str
    as_loss: bool
    coef: float
    jsd_beta: float
    loss_max_clamp: float | None
    log_prob_min_clamp: float | None
    loss_agg_mode: str

    @classmethod
    def from_config(cls, dist: DistillationConfig, loss_agg_mode: str) -> DistillationTerm | None:
        """None when distillation is off."""
        if not dist.enabled:
            return None
        loss = dist.distillation_loss
        return cls(
            loss_mode=loss.loss_mode,
            as_loss=not loss.use_policy_gradient,
            coef=loss.distillation_loss_coef,
            jsd_beta=loss.jsd_beta,
            loss_max_clamp=loss.loss_max_clamp,
            log_prob_min_clamp=loss.log_prob_min_clamp,
            loss_agg_mode=loss_agg_mode,
        )

    @property
    def gathers_topk(self) -> bool:
        """The student's log-probs are needed at the teacher's top-K ids (a top-K loss)."""
        return uses_topk(self.loss_mode)

    def required_fields(self) -> list[str]:
        return [FK.TEACHER_LOG_PROB] + ([FK.TEACHER_TOPK_LOG_PROBS, FK.TEACHER_TOPK_IDS] if self.gathers_topk else [])

    def __call__(
        self, outputs: dict[str, torch.Tensor], micro: TensorDict, mask: torch.Tensor, info: GlobalBatchInfo
    ) -> tuple[torch.Tensor | None, dict[str, torch.Tensor]]:
        """``(c · loss or None, metrics)``; ``mask``: the response mask (agent-loop holes are 0)."""
        log_prob, teacher = outputs["log_probs"], micro[FK.TEACHER_LOG_PROB]

        def token_mean(x: torch.Tensor) -> torch.Tensor:
            return agg_loss_with_info(x.detach(), mask, "token-mean", info)

        metrics = {"distill/kl": token_mean(log_prob - teacher), "distill/teacher_logp": token_mean(teacher)}
        if self.gathers_topk:
            metrics["distill/topk_teacher_mass"] = token_mean(topk_mass(micro[FK.TEACHER_TOPK_LOG_PROBS]))
            metrics["distill/topk_student_mass"] = token_mean(topk_mass(outputs["topk_log_probs"]))
        if not self.as_loss:
            return None, metrics
        if self.gathers_topk:
            d = topk_divergence(
                self.loss_mode,
                outputs["topk_log_probs"],
                micro[FK.TEACHER_TOPK_LOG_PROBS],
                self.jsd_beta,
                self.loss_max_clamp,
            )
        else:
            d = sampled_token_divergence(
                log_prob, teacher, self.loss_mode, self.log_prob_min_clamp, self.loss_max_clamp
            )
        loss = agg_loss_with_info(d, mask, self.loss_agg_mode, info)
        metrics["distill/loss"] = loss.detach()
        return self.coef * loss, metrics
