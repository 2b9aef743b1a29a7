"""On-policy distillation: per-token divergences between a student and a teacher.

The student samples a response y; the teacher scores the same tokens. With ℓ_t = log π_S(y_t)
and ℓ^T_t = log π_T(y_t) (both at the sampling temperature):

* **Estimator losses** (the sampled token only; names of :mod:`hybridflow.algorithms.kl`):
  D_t = KL-estimator(ℓ_t, ℓ^T_t), e.g. k1 = ℓ − ℓ^T, k3 = e^{ℓ^T−ℓ} − (ℓ^T − ℓ) − 1. Their
  mean over the student's own samples estimates the reverse KL(π_S ‖ π_T) per token.
* **Top-K losses** (the teacher's K most likely tokens per position, ids ``i_1..i_K``):
  p̃ = softmax(ℓ^T_{i_1..i_K}) (the teacher renormalised over its top K), q_k = π_S(i_k) (the
  student's full-vocabulary log-probs gathered at the same ids).

  - ``forward_kl_topk``: D_t = Σ_k p̃_k (log p̃_k − log q_k) ≥ 0; with K = V it is exactly
    KL(π_T ‖ π_S) (GKD, Agarwal et al. 2024, arXiv 2306.13649).
  - ``jsd_topk``: both renormalised over the K ids (q̃), M = β p̃ + (1 − β) q̃,
    D_t = β KL(p̃ ‖ M) + (1 − β) KL(q̃ ‖ M) (GKD's generalised JSD).

Two ways to train on D (``distillation.distillation_loss.use_policy_gradient``):

* as a reward: A_t ← w·A_t − c·D_t(ℓ_old, ℓ^T), with D an estimator (on-policy distillation as
  RL with a dense per-token reward; Thinking Machines, "On-Policy Distillation", 2025);
* as a loss: L ← L_pg + c · agg(D_t(ℓ, ℓ^T)), differentiated directly.

Tensors are (B, T) per token, (B, T, K) for top-K. New losses: ``@DISTILLATION_LOSSES.register``
with a :class:`DistillationLossSpec`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from hybridflow.algorithms.kl import KL_ESTIMATORS, kl_penalty
from hybridflow.utils.registry import Registry

DistillationLossFn = Callable[..., torch.Tensor]


@dataclass(frozen=True)
class DistillationLossSpec:
    """How a registered loss reads its inputs: the sampled token's log-probs (estimators) or
    top-K log-probs (``uses_topk``)."""

    uses_topk: bool


DISTILLATION_LOSSES: Registry[DistillationLossFn] = Registry("distillation loss")


def _renormalise(topk_log_probs: torch.Tensor) -> torch.Tensor:
    """log of the distribution renormalised over the last dim (the K ids)."""
    return topk_log_probs - torch.logsumexp(topk_log_probs, dim=-1, keepdim=True)


def _kl_terms(log_p: torch.Tensor, log_q: torch.Tensor) -> torch.Tensor:
    """Σ_k p_k (log p_k − log q_k) over the last dim, with 0 · log 0 = 0."""
    p = log_p.exp()
    return torch.where(p > 0, p * (log_p - log_q), torch.zeros_like(p)).sum(dim=-1)


def forward_kl_topk(student_topk_log_probs: torch.Tensor, teacher_topk_log_probs: torch.Tensor) -> torch.Tensor:
    """(B, T): KL(p̃_T ‖ q_S) over the teacher's top K (teacher renormalised, student not)."""
    return _kl_terms(_renormalise(teacher_topk_log_probs.float()), student_topk_log_probs.float())


def jsd_topk(
    student_topk_log_probs: torch.Tensor, teacher_topk_log_probs: torch.Tensor, jsd_beta: float = 0.5
) -> torch.Tensor:
    """(B, T): β KL(p̃ ‖ M) + (1 − β) KL(q̃ ‖ M), M = β p̃ + (1 − β) q̃, both renormalised over K."""
    if not 0.0 < jsd_beta < 1.0:
        raise ValueError(f"jsd_beta must be in (0, 1), got {jsd_beta}")
    log_p = _renormalise(teacher_topk_log_probs.float())
    log_q = _renormalise(student_topk_log_probs.float())
    log_m = torch.logaddexp(log_p + torch.log(torch.tensor(jsd_beta)), log_q + torch.log(torch.tensor(1.0 - jsd_beta)))
    return jsd_beta * _kl_terms(log_p, log_m) + (1.0 - jsd_beta) * _kl_terms(log_q, log_m)


def _estimator(name: str) -> DistillationLossFn:
    def divergence(student_log_prob: torch.Tensor, teacher_log_prob: torch.Tensor) -> torch.Tensor:
        return kl_penalty(student_log_prob, teacher_log_prob, name)

    divergence.__doc__ = f"(B, T): the {name} estimator of KL(π_S ‖ π_T) on the sampled token."
    return divergence


for _name in KL_ESTIMATORS.names():
    DISTILLATION_LOSSES.add(_name, _estimator(_name), meta=DistillationLossSpec(uses_topk=False))
DISTILLATION_LOSSES.add("forward_kl_topk", forward_kl_topk, meta=DistillationLossSpec(uses_topk=True))
DISTILLATION_LOSSES.add("jsd_topk", jsd_topk, meta=DistillationLossSpec(uses_topk=True))


def uses_topk(loss_mode: str) -> bool:
    """True when ``loss_mode`` needs the teacher's top-K log-probs and ids."""
    return DISTILLATION_LOSSES.meta(loss_mode).uses_topk


def sampled_token_divergence(
    student_log_prob: torch.Tensor,
    teacher_log_prob: torch.Tensor,
    estimator: str,
    log_prob_min_clamp: float | None = None,
    loss_max_clamp: float | None = None,
) -> torch.Tensor:
    """(B, T): D_t = estimator(ℓ_t, ℓ^T_t); log-probs clamped below at ``log_prob_min_clamp`` and
    D at ±``loss_max_clamp`` when given (clamped tokens carry no gradient)."""
    if log_prob_min_clamp is not None:
        student_log_prob = student_log_prob.clamp(min=log_prob_min_clamp)
        teacher_log_prob = teacher_log_prob.clamp(min=log_prob_min_clamp)
    if uses_topk(estimator):
        raise ValueError(f"distillation loss {estimator!r} needs the teacher's top-K, not only the sampled token")
    d = DISTILLATION_LOSSES.get(estimator)(student_log_prob, teacher_log_prob)
    return d if loss_max_clamp is None else d.clamp(min=-loss_max_clamp, max=loss_max_clamp)


def topk_divergence(
    loss_mode: str,
    student_topk_log_probs: torch.Tensor,
    teacher_topk_log_probs: torch.Tensor,
    jsd_beta: float = 0.5,
    loss_max_clamp: float | None = None,
) -> torch.Tensor:
    """(B, T): the registered top-K loss ``loss_mode``, clamped at ``loss_max_clamp`` when given."""
    fn = DISTILLATION_LOSSES.get(loss_mode)
    if not uses_topk(loss_mode):
        raise ValueError(f"distillation loss {loss_mode!r} is an estimator on the sampled token, not a top-K loss")
    kwargs = {"jsd_beta": jsd_beta} if fn is jsd_topk else {}
    d = fn(student_topk_log_probs, teacher_topk_log_probs, **kwargs)
    return d if loss_max_clamp is None else d.clamp(max=loss_max_clamp)


def fold_distillation_advantage(
    advantages: torch.Tensor,
    student_log_prob: torch.Tensor,
    teacher_log_prob: torch.Tensor,
    response_mask: torch.Tensor,
    estimator: str,
    reward_weight: float,
    coef: float,
    log_prob_min_clamp: float | None = None,
    loss_max_clamp: float | None = None,
) -> torch.Tensor:
    """(B, T): A_t ← w·A_t − c·D_t(ℓ_old, ℓ^T) on response tokens (0 elsewhere): the negative
    divergence of each sampled token is its own reward, undiscounted and not whitened.
    ``student_log_prob`` is the sampling policy's ℓ_old (no gradient)."""
    d = sampled_token_divergence(
        student_log_prob.detach(), teacher_log_prob, estimator, log_prob_min_clamp, loss_max_clamp
    )
    mask = response_mask.to(advantages.dtype)
    return (reward_weight * advantages - coef * d) * mask


def topk_mass(topk_log_probs: torch.Tensor) -> torch.Tensor:
    """(B, T): Σ_k exp(ℓ_{i_k}), the probability the K ids hold (the top-K coverage)."""
    return topk_log_probs.float().exp().sum(dim=-1)
