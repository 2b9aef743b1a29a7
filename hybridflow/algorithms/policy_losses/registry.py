"""The policy-loss registry (``actor_rollout_ref.actor.policy_loss.loss_mode``) and shared helpers.

Calling convention every registered loss follows, so the actor calls all of them one way::

    loss, metrics = fn(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode,
                       **select_policy_loss_params(name, scalars),
                       rollout_is_weights=w_or_None, global_batch_info=info_or_None)

* the four tensors are (B, T); ``log_prob`` carries the gradient;
* loss-specific scalars are keyword-only and named after their config keys; the
  :class:`PolicyLossSpec` registered with the loss lists them, and
  :func:`select_policy_loss_params` picks them out of a mapping of all the actor's scalars
  (``clip_ratio_low`` / ``clip_ratio_high`` must already be resolved: None → ``clip_ratio``);
* ``rollout_is_weights`` (B, T) multiplies the per-token losses before aggregation;
* ``global_batch_info`` (:class:`~hybridflow.algorithms.aggregation.GlobalBatchInfo`) carries the
  micro-batch / data-parallel normalisers;
* ``metrics`` holds detached tensors, at least ``actor/pg_clipfrac``, ``actor/ppo_kl`` and
  ``actor/pg_clipfrac_lower``. No ``.item()`` inside a loss: the only host syncs are the
  aggregated-loss finite check in ``agg_loss`` and, for ``clip_cov`` / ``kl_cov``, the token
  counts their top-k / random selection needs.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch

from hybridflow.algorithms.utils import masked_mean
from hybridflow.utils.registry import Registry

PolicyLossFn = Callable[..., tuple[torch.Tensor, dict[str, torch.Tensor]]]

# exp() of a log-ratio beyond ±20 only produces overflow, never a useful ratio.
LOG_RATIO_BOUND = 20.0


@dataclass(frozen=True)
class PolicyLossSpec:
    """The keyword scalars (config key names) a policy loss takes."""

    params: tuple[str, ...] = ()


POLICY_LOSSES: Registry[PolicyLossFn] = Registry("policy loss")


def register_policy_loss(name: str, spec: PolicyLossSpec | None = None) -> Callable[[PolicyLossFn], PolicyLossFn]:
    """Decorator registering a policy loss; same function twice is a no-op, a clash raises."""
    return POLICY_LOSSES.register(name, meta=spec if spec is not None else PolicyLossSpec())


def get_policy_loss_fn(name: str) -> PolicyLossFn:
    """The loss function; unknown names raise ValueError listing the registered ones."""
    return POLICY_LOSSES.get(name)


def get_policy_loss_spec(name: str) -> PolicyLossSpec:
    return POLICY_LOSSES.meta(name)


def select_policy_loss_params(name: str, available: Mapping[str, object]) -> dict[str, object]:
    """The subset of ``available`` that loss ``name`` declares; declared keys missing from
    ``available`` are left out (the function's default applies)."""
    return {key: available[key] for key in get_policy_loss_spec(name).params if key in available}


def clamped_log_ratio(log_prob: torch.Tensor, old_log_prob: torch.Tensor) -> torch.Tensor:
    """δ = clamp(ℓ − ℓ_old, −20, 20), the log of the importance ratio ρ."""
    return torch.clamp(log_prob - old_log_prob, min=-LOG_RATIO_BOUND, max=LOG_RATIO_BOUND)


def apply_is_weights(pg_losses: torch.Tensor, rollout_is_weights: torch.Tensor | None) -> torch.Tensor:
    return pg_losses if rollout_is_weights is None else pg_losses * rollout_is_weights


def pg_metrics(
    pg_clipfrac: torch.Tensor, ppo_kl: torch.Tensor, pg_clipfrac_lower: torch.Tensor
) -> dict[str, torch.Tensor]:
    """The three standard metrics, detached."""
    return {
        "actor/pg_clipfrac": pg_clipfrac.detach(),
        "actor/ppo_kl": ppo_kl.detach(),
        "actor/pg_clipfrac_lower": pg_clipfrac_lower.detach(),
    }


def ppo_kl(log_ratio: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """masked_mean(ℓ_old − ℓ): the approximate KL(π_old ‖ π) of the update so far."""
    return masked_mean(-log_ratio, response_mask)


def zero_metric(like: torch.Tensor) -> torch.Tensor:
    return torch.zeros((), dtype=like.dtype, device=like.device)


def check_clip_ratios(clip_ratio_low: float, clip_ratio_high: float) -> None:
    if clip_ratio_low < 0 or clip_ratio_high < 0:
        raise ValueError(f"clip_ratio_low / clip_ratio_high must be >= 0, got {clip_ratio_low} / {clip_ratio_high}")
