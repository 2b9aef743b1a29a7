"""The advantage-estimator registry and the declaration of what each estimator needs.

Every estimator is registered with an :class:`EstimatorSpec`. The trainer reads the spec to
decide which phases to run (critic values? reference log-probs? a greedy baseline pass?) and
:func:`hybridflow.algorithms.advantages.compute_advantage` reads it to pass each estimator exactly
the inputs it declared — one code path for every name, no ``if name == "gae"`` anywhere.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass

import torch

from hybridflow.utils.registry import Registry

AdvantageFn = Callable[..., tuple[torch.Tensor, torch.Tensor]]


class AdvantageEstimator(str, enum.Enum):
    """Built-in estimator names (``algorithm.adv_estimator``), with verl's string values."""

    GAE = "gae"
    GRPO = "grpo"
    REINFORCE_PLUS_PLUS = "reinforce_plus_plus"
    REINFORCE_PLUS_PLUS_BASELINE = "reinforce_plus_plus_baseline"
    REMAX = "remax"
    RLOO = "rloo"
    OPO = "opo"
    GRPO_PASSK = "grpo_passk"
    GPG = "gpg"
    RLOO_VECTORIZED = "rloo_vectorized"
    GRPO_VECTORIZED = "grpo_vectorized"
    OPTIMAL_TOKEN_BASELINE = "optimal_token_baseline"
    TIR_OPTIMAL_TOKEN_BASELINE = "tir_optimal_token_baseline"
    GDPO = "gdpo"


@dataclass(frozen=True)
class EstimatorSpec:
    """What an estimator reads besides ``token_level_rewards`` and ``response_mask``.

    Each ``needs_*`` flag makes :func:`compute_advantage` pass (and require) the keyword of the
    same name: ``values`` (critic, so a critic is needed), ``index`` (group ids = the ``uid``
    column), ``ref_log_prob`` (reference policy), ``reward_baselines`` (ReMax greedy pass),
    ``old_log_probs``, ``sum_pi_squared``, ``reward_components`` (GDPO: a (B, K) tensor of the
    reward parts named by ``algorithm.gdpo_reward_keys``; optional, None = use the score).
    ``requires_groups``: only meaningful with ``rollout.n > 1``.
    ``accepts_rollout_is_weights``: passed ``rollout_is_weights`` when the caller has them.
    ``params``: names of scalar config keys (``gamma``, ``lam``, ...) the estimator takes as
    keywords; the caller's value for each is passed when it supplies one.
    """

    needs_values: bool = False
    needs_index: bool = False
    requires_groups: bool = False
    needs_ref_log_prob: bool = False
    needs_reward_baselines: bool = False
    needs_old_log_probs: bool = False
    needs_sum_pi_squared: bool = False
    needs_multi_reward: bool = False
    accepts_rollout_is_weights: bool = False
    params: tuple[str, ...] = ()


ADV_ESTIMATORS: Registry[AdvantageFn] = Registry("advantage estimator")

# Shared declaration of the group-relative outcome estimators.
GROUP_SPEC = EstimatorSpec(needs_index=True, requires_groups=True)


def register_adv_est(
    name_or_enum: str | AdvantageEstimator, spec: EstimatorSpec | None = None
) -> Callable[[AdvantageFn], AdvantageFn]:
    """Decorator registering an estimator under a name; ``spec`` defaults to "needs nothing else".

    The same function twice is a no-op; a different function under a taken name raises
    ValueError. The function must return ``(advantages, returns)``, both (B, T).
    """
    return ADV_ESTIMATORS.register(name_or_enum, meta=spec if spec is not None else EstimatorSpec())


def get_adv_estimator_fn(name_or_enum: str | AdvantageEstimator) -> AdvantageFn:
    """The estimator function; unknown names raise ValueError listing the registered ones."""
    return ADV_ESTIMATORS.get(name_or_enum)


def get_estimator_spec(name_or_enum: str | AdvantageEstimator) -> EstimatorSpec:
    """The :class:`EstimatorSpec` declared at registration."""
    return ADV_ESTIMATORS.meta(name_or_enum)
