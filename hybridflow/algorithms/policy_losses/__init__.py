"""Policy losses (``actor_rollout_ref.actor.policy_loss.loss_mode``) and their registry.

Importing this package registers every built-in loss. The calling convention is described in
:mod:`hybridflow.algorithms.policy_losses.registry`.
"""

from hybridflow.algorithms.policy_losses import bypass, cov, dppo, ppo  # noqa: F401  (registers)
from hybridflow.algorithms.policy_losses.bypass import (
    compute_policy_loss_bypass_mode,
    compute_policy_loss_reinforce,
)
from hybridflow.algorithms.policy_losses.cov import compute_policy_loss_clip_cov, compute_policy_loss_kl_cov
from hybridflow.algorithms.policy_losses.dppo import compute_policy_loss_dppo_kl, compute_policy_loss_dppo_tv
from hybridflow.algorithms.policy_losses.ppo import (
    compute_policy_loss_cispo,
    compute_policy_loss_dro,
    compute_policy_loss_geo_mean,
    compute_policy_loss_gpg,
    compute_policy_loss_gspo,
    compute_policy_loss_sapo,
    compute_policy_loss_vanilla,
)
from hybridflow.algorithms.policy_losses.registry import (
    POLICY_LOSSES,
    PolicyLossFn,
    PolicyLossSpec,
    get_policy_loss_fn,
    get_policy_loss_spec,
    register_policy_loss,
    select_policy_loss_params,
)

__all__ = [
    "POLICY_LOSSES",
    "PolicyLossFn",
    "PolicyLossSpec",
    "compute_policy_loss_bypass_mode",
    "compute_policy_loss_cispo",
    "compute_policy_loss_clip_cov",
    "compute_policy_loss_dppo_kl",
    "compute_policy_loss_dppo_tv",
    "compute_policy_loss_dro",
    "compute_policy_loss_geo_mean",
    "compute_policy_loss_gpg",
    "compute_policy_loss_gspo",
    "compute_policy_loss_kl_cov",
    "compute_policy_loss_reinforce",
    "compute_policy_loss_sapo",
    "compute_policy_loss_vanilla",
    "get_policy_loss_fn",
    "get_policy_loss_spec",
    "register_policy_loss",
    "select_policy_loss_params",
]
