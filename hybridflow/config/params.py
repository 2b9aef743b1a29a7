"""Scalar keys of config sections as ``{key name: value}`` — what algorithm registries take.

Estimators and policy losses declare the config keys they read (``EstimatorSpec.params``,
``PolicyLossSpec.params``: ``gamma``, ``clip_ratio_low``, ``rollout_is``, ...). These helpers
give callers one mapping of every scalar in the relevant sections, so the registry picks what
each function declares and no caller branches on names::

    kwargs = select_policy_loss_params(loss_mode, policy_loss_params(cfg.actor_rollout_ref.actor))
"""

from __future__ import annotations

from typing import Any

from hybridflow.config.actor_rollout_ref import ActorConfig
from hybridflow.config.ppo import AlgorithmConfig
from hybridflow.config.spec import config_fields, is_section


def scalar_params(*sections: Any) -> dict[str, Any]:
    """``{name: value}`` of the leaf keys (not sub-sections) of each section; later ones win."""
    out: dict[str, Any] = {}
    for sec in sections:
        for name, f in config_fields(type(sec)).items():
            if not is_section(f):
                out[name] = getattr(sec, name)
    return out


def policy_loss_params(actor: ActorConfig) -> dict[str, Any]:
    """Scalars of ``actor``, ``actor.policy_loss`` and ``actor.policy_loss.rollout_correction``."""
    return scalar_params(actor, actor.policy_loss, actor.policy_loss.rollout_correction)


def advantage_params(algorithm: AlgorithmConfig) -> dict[str, Any]:
    """Scalars of ``algorithm`` (gamma, lam, norm_adv_by_std_in_grpo, gdpo_reward_weights, ...)."""
    return scalar_params(algorithm)
