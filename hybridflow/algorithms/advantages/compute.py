"""One entry point that runs any registered advantage estimator from its declared needs."""

from __future__ import annotations

from collections.abc import Mapping

import torch

from hybridflow.algorithms.advantages.grouping import GroupIndex
from hybridflow.algorithms.advantages.registry import (
    AdvantageEstimator,
    EstimatorSpec,
    get_adv_estimator_fn,
    get_estimator_spec,
)
from hybridflow.algorithms.utils import check_finite


def _optional_tensors(
    spec: EstimatorSpec,
    values: torch.Tensor | None,
    ref_log_prob: torch.Tensor | None,
    reward_baselines: torch.Tensor | None,
    old_log_probs: torch.Tensor | None,
    sum_pi_squared: torch.Tensor | None,
) -> list[tuple[str, bool, torch.Tensor | None]]:
    """(keyword, declared as needed, given tensor) for every spec-driven tensor input."""
    return [
        ("values", spec.needs_values, values),
        ("ref_log_prob", spec.needs_ref_log_prob, ref_log_prob),
        ("reward_baselines", spec.needs_reward_baselines, reward_baselines),
        ("old_log_probs", spec.needs_old_log_probs, old_log_probs),
        ("sum_pi_squared", spec.needs_sum_pi_squared, sum_pi_squared),
    ]


def _declared_inputs(
    spec: EstimatorSpec,
    where: str,
    response_mask: torch.Tensor,
    index: GroupIndex | None,
    tensors: list[tuple[str, bool, torch.Tensor | None]],
    rollout_is_weights: torch.Tensor | None,
    reward_components: torch.Tensor | None,
) -> dict[str, object]:
    """The keyword inputs the spec declares, each checked for presence and finiteness."""
    kwargs: dict[str, object] = {}
    if spec.needs_index:
        if index is None:
            raise ValueError(f"{where}: the estimator groups rows by prompt and needs index= (the uid column)")
        kwargs["index"] = index
    for keyword, needed, tensor in tensors:
        if not needed:
            continue
        if tensor is None:
            raise ValueError(f"{where}: the estimator declares that it needs {keyword}=, which was not given")
        check_finite(keyword, tensor, response_mask if tensor.dim() == 2 else None, where=where)
        kwargs[keyword] = tensor
    if spec.needs_multi_reward:
        if reward_components is not None:
            check_finite("reward_components", reward_components, where=where)
        kwargs["reward_components"] = reward_components
    if spec.accepts_rollout_is_weights and rollout_is_weights is not None:
        check_finite("rollout_is_weights", rollout_is_weights, response_mask, where=where)
        kwargs["rollout_is_weights"] = rollout_is_weights
    return kwargs


def compute_advantage(
    adv_estimator: str | AdvantageEstimator,
    *,
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: GroupIndex | None = None,
    values: torch.Tensor | None = None,
    reward_baselines: torch.Tensor | None = None,
    old_log_probs: torch.Tensor | None = None,
    ref_log_prob: torch.Tensor | None = None,
    sum_pi_squared: torch.Tensor | None = None,
    rollout_is_weights: torch.Tensor | None = None,
    reward_components: torch.Tensor | None = None,
    params: Mapping[str, object] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Run ``algorithm.adv_estimator`` and return ``(advantages, returns)``, both (B, T).

    The estimator's :class:`EstimatorSpec` decides which of the keyword inputs it receives; a
    declared input that is None raises ValueError naming it. Inputs the spec does not declare are
    ignored, so the trainer can always pass everything it has. ``params`` maps scalar config keys
    (``gamma``, ``lam``, ``norm_adv_by_std_in_grpo``, ``gdpo_reward_weights``, ...) to values;
    only the keys the spec lists in ``params`` are passed, the estimator's defaults cover the rest.

    Every tensor input is checked for NaN/inf (at mask-1 positions for (B, T) tensors) and so
    are the outputs: a ValueError names the offending tensor instead of training on NaN. These
    checks cost a few host syncs per step; the estimators run on the controller, once per batch.
    """
    name = adv_estimator.value if isinstance(adv_estimator, AdvantageEstimator) else adv_estimator
    fn = get_adv_estimator_fn(name)
    spec = get_estimator_spec(name)
    where = f"compute_advantage({name!r})"
    if token_level_rewards.dim() != 2 or token_level_rewards.shape != response_mask.shape:
        raise ValueError(
            f"{where}: token_level_rewards {tuple(token_level_rewards.shape)} and response_mask "
            f"{tuple(response_mask.shape)} must both be (B, T)"
        )
    check_finite("token_level_rewards", token_level_rewards, where=where)
    tensors = _optional_tensors(spec, values, ref_log_prob, reward_baselines, old_log_probs, sum_pi_squared)
    kwargs = _declared_inputs(spec, where, response_mask, index, tensors, rollout_is_weights, reward_components)
    given = params if params is not None else {}
    kwargs.update({key: given[key] for key in spec.params if key in given})
    advantages, returns = fn(token_level_rewards=token_level_rewards, response_mask=response_mask, **kwargs)
    for label, out in (("advantages", advantages), ("returns", returns)):
        if out.shape != token_level_rewards.shape:
            raise ValueError(f"{where}: the estimator returned {label} of shape {tuple(out.shape)}, expected (B, T)")
        check_finite(label, out, response_mask, where=where)
    return advantages, returns
