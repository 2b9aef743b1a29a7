"""KL estimators, KL-coefficient controllers, and the in-reward KL penalty.

Estimators (Schulman, "Approximating KL divergence", http://joschu.net/blog/kl-approx.html), with
d = ℓ − ℓ_ref per token, ℓ = log-prob under the policy, ℓ_ref under the reference:

* ``kl`` / ``k1``          d
* ``abs``                  |d|
* ``mse`` / ``k2``         ½ d²
* ``low_var_kl`` / ``k3``  u = clamp(ℓ_ref − ℓ, −20, 20);  clamp(exp(u) − u − 1, 0, 10)  (≥ 0)
* a ``+`` suffix (``k1+``, ``k3+``, ``low_var_kl+``): the value of the base estimator with the
  gradient of k2 (straight-through: k2 − sg(k2) + sg(base)); ``k2+`` / ``mse+`` equal k2.

Selected by ``algorithm.kl_penalty`` (in-reward KL) and ``actor_rollout_ref.actor.kl_loss_type``
(KL loss). New estimators: ``@KL_ESTIMATORS.register("name")`` on ``fn(logprob, ref_logprob)``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from hybridflow.algorithms.utils import check_finite, masked_mean
from hybridflow.utils.registry import Registry

KLEstimator = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]

KL_ESTIMATORS: Registry[KLEstimator] = Registry("KL estimator")

# exp() of more than this overflows float32 long before it carries information.
_LOG_RATIO_BOUND = 20.0
_K3_BOUND = 10.0


def _k1(logprob: torch.Tensor, ref_logprob: torch.Tensor) -> torch.Tensor:
    """k1 = ℓ − ℓ_ref (unbiased, high variance, can be negative)."""
    return logprob - ref_logprob


def _abs(logprob: torch.Tensor, ref_logprob: torch.Tensor) -> torch.Tensor:
    """|ℓ − ℓ_ref|."""
    return (logprob - ref_logprob).abs()


def _k2(logprob: torch.Tensor, ref_logprob: torch.Tensor) -> torch.Tensor:
    """k2 = ½ (ℓ − ℓ_ref)²; its gradient is the gradient of KL(π‖π_ref) in expectation."""
    return 0.5 * (logprob - ref_logprob).square()


def _k3(logprob: torch.Tensor, ref_logprob: torch.Tensor) -> torch.Tensor:
    """k3 = exp(u) − u − 1 with u = clamp(ℓ_ref − ℓ, ±20), clamped to [0, 10]; ≥ 0, low variance.

    Computed as expm1(u) − u: for |u| near fp32's resolution, exp(u) − u − 1 rounds to −u < 0
    (u = −6e-8 gave −6e-8). The lower clamp is 0, not verl's −10 (which a non-negative value
    never reaches): it only removes what rounding leaves below zero."""
    u = torch.clamp(ref_logprob - logprob, min=-_LOG_RATIO_BOUND, max=_LOG_RATIO_BOUND)
    return torch.clamp(torch.expm1(u) - u, min=0.0, max=_K3_BOUND)


for _name, _fn in (
    ("kl", _k1),
    ("k1", _k1),
    ("abs", _abs),
    ("mse", _k2),
    ("k2", _k2),
    ("low_var_kl", _k3),
    ("k3", _k3),
):
    KL_ESTIMATORS.add(_name, _fn)

_K2_NAMES = ("mse", "k2")


def kl_penalty(logprob: torch.Tensor, ref_logprob: torch.Tensor, kl_penalty: str) -> torch.Tensor:
    """Per-token KL estimate, shape = ``logprob.shape`` (see the module docstring for the names).

    A ``+`` suffix returns the base value with the k2 gradient: k2 − sg(k2) + sg(base).
    Unknown names raise ValueError listing the registered ones (``full`` is not supported).
    """
    straight_through = kl_penalty.endswith("+")
    base_name = kl_penalty[:-1] if straight_through else kl_penalty
    value = KL_ESTIMATORS.get(base_name)(logprob, ref_logprob)
    if not straight_through or base_name in _K2_NAMES:
        return value
    k2 = _k2(logprob, ref_logprob)
    return k2 - k2.detach() + value.detach()


def check_kl_penalty_name(name: str) -> None:
    """Raise ValueError unless ``name`` is a registered estimator, optionally with a ``+`` suffix.

    For start-up validation of ``algorithm.kl_penalty`` / ``actor.kl_loss_type``.
    """
    base_name = name[:-1] if name.endswith("+") else name
    if base_name not in KL_ESTIMATORS:
        valid = ", ".join(KL_ESTIMATORS.names())
        raise ValueError(f"unknown KL estimator {name!r}; valid names: {valid} (each also with a '+' suffix)")


# apply_kl_penalty's argument is named after the config key and shadows the function.
_kl_penalty_fn = kl_penalty


class FixedKLController:
    """β stays at ``kl_coef`` (``algorithm.kl_ctrl.type=fixed``)."""

    def __init__(self, kl_coef: float) -> None:
        self.value = float(kl_coef)

    def update(self, current_kl: float, n_steps: int) -> None:
        """No-op: a fixed coefficient ignores the observed KL."""

    def state_dict(self) -> dict[str, float]:
        return {"value": self.value}

    def load_state_dict(self, state: dict[str, float]) -> None:
        self.value = float(state["value"])


class AdaptiveKLController:
    """Adaptive β (Ziegler et al. 2019, arXiv 1909.08593), ``algorithm.kl_ctrl.type=adaptive``.

    update: e = clip(current_kl / target_kl − 1, −0.2, 0.2);  β ← β · (1 + e · n_steps / horizon).
    β moves up when the KL is above target and down when below.
    """

    def __init__(self, init_kl_coef: float, target_kl: float, horizon: int) -> None:
        if horizon <= 0:
            raise ValueError(f"AdaptiveKLController: horizon must be > 0, got {horizon}")
        if target_kl <= 0:
            raise ValueError(f"AdaptiveKLController: target_kl must be > 0, got {target_kl}")
        self.value = float(init_kl_coef)
        self.target = float(target_kl)
        self.horizon = horizon

    def update(self, current_kl: float, n_steps: int) -> None:
        error = min(max(current_kl / self.target - 1.0, -0.2), 0.2)
        self.value *= 1.0 + error * n_steps / self.horizon

    def state_dict(self) -> dict[str, float]:
        return {"value": self.value}

    def load_state_dict(self, state: dict[str, float]) -> None:
        self.value = float(state["value"])


KLController = FixedKLController | AdaptiveKLController


def get_kl_controller(
    type: str,  # noqa: A002 - named after the config key algorithm.kl_ctrl.type
    kl_coef: float,
    horizon: int | None = None,
    target_kl: float | None = None,
) -> KLController:
    """Build the controller named by ``algorithm.kl_ctrl.type`` (``fixed`` or ``adaptive``)."""
    if type == "fixed":
        return FixedKLController(kl_coef=kl_coef)
    if type == "adaptive":
        if horizon is None or target_kl is None:
            raise ValueError("algorithm.kl_ctrl.type=adaptive needs kl_ctrl.horizon and kl_ctrl.target_kl")
        return AdaptiveKLController(init_kl_coef=kl_coef, target_kl=target_kl, horizon=horizon)
    raise ValueError(f"unknown algorithm.kl_ctrl.type {type!r}; valid types: adaptive, fixed")


def apply_kl_penalty(
    token_level_scores: torch.Tensor,
    old_log_probs: torch.Tensor,
    ref_log_prob: torch.Tensor,
    response_mask: torch.Tensor,
    kl_ctrl: KLController,
    kl_penalty: str = "kl",
) -> tuple[torch.Tensor, dict[str, float]]:
    """KL in the reward (``algorithm.use_kl_in_reward``): r = scores − β · kl · m, all (B, T).

    kl = kl_penalty(ℓ_old, ℓ_ref, ``algorithm.kl_penalty``) · m; β = ``kl_ctrl.value`` *before*
    this call's update. The controller is then updated with the batch KL (mean over rows of the
    per-row masked mean) and n_steps = B. Returns the rewards and the metrics
    ``actor/reward_kl_penalty`` and ``actor/reward_kl_penalty_coeff`` (floats; this runs once
    per step on the controller, where a host sync is harmless).
    """
    check_finite("old_log_probs", old_log_probs, response_mask, where="apply_kl_penalty")
    check_finite("ref_log_prob", ref_log_prob, response_mask, where="apply_kl_penalty")
    kld = _kl_penalty_fn(old_log_probs, ref_log_prob, kl_penalty) * response_mask
    beta = kl_ctrl.value
    token_level_rewards = token_level_scores - beta * kld
    current_kl = float(masked_mean(kld, response_mask, axis=-1).mean())
    kl_ctrl.update(current_kl=current_kl, n_steps=token_level_scores.shape[0])
    return token_level_rewards, {
        "actor/reward_kl_penalty": current_kl,
        "actor/reward_kl_penalty_coeff": beta,
    }
