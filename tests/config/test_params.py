"""Scalar views of config sections match what the algorithm registries declare."""

from __future__ import annotations

from hybridflow.algorithms.advantages import ADV_ESTIMATORS, get_estimator_spec
from hybridflow.algorithms.policy_losses import POLICY_LOSSES, get_policy_loss_spec
from hybridflow.config import advantage_params, load_config, policy_loss_params, scalar_params

ARR = "actor_rollout_ref"


def test_policy_loss_params_flatten_actor_loss_and_correction():
    cfg = load_config(None, [f"{ARR}.actor.clip_ratio_high=0.28", f"{ARR}.actor.policy_loss.tau_neg=1.2"])
    params = policy_loss_params(cfg.actor_rollout_ref.actor)
    assert params["clip_ratio_low"] == 0.2 and params["clip_ratio_high"] == 0.28 and params["clip_ratio_c"] == 3.0
    assert params["tau_neg"] == 1.2 and params["loss_type"] == "ppo_clip" and params["rollout_is_threshold"] == 2.0
    assert "optim" not in params and "policy_loss" not in params and "rollout_correction" not in params


def test_advantage_params():
    cfg = load_config(None, ["algorithm.gamma=0.99", "algorithm.lam=0.95"])
    params = advantage_params(cfg.algorithm)
    assert (params["gamma"], params["lam"], params["norm_adv_by_std_in_grpo"]) == (0.99, 0.95, True)
    assert "kl_ctrl" not in params


def test_later_sections_win():
    cfg = load_config()
    merged = scalar_params(cfg.actor_rollout_ref.rollout, cfg.actor_rollout_ref.rollout.val_kwargs)
    assert merged["temperature"] == 0.0 and merged["do_sample"] is False and merged["name"] == "torch"


def test_every_declared_algorithm_param_is_a_config_key():
    cfg = load_config()
    loss_keys = policy_loss_params(cfg.actor_rollout_ref.actor)
    adv_keys = advantage_params(cfg.algorithm)
    missing = {name: [p for p in get_policy_loss_spec(name).params if p not in loss_keys] for name in POLICY_LOSSES}
    missing |= {name: [p for p in get_estimator_spec(name).params if p not in adv_keys] for name in ADV_ESTIMATORS}
    assert {name: keys for name, keys in missing.items() if keys} == {}
