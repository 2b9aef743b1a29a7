"""Defaults load, are well-typed, documented, immutable, and get their derived values at load."""

from __future__ import annotations

import dataclasses
import pickle

import pytest

from hybridflow.config import PPOConfig, load_config
from hybridflow.config.coerce import coerce
from hybridflow.config.spec import default_of, help_of, iter_leaves


def test_defaults_load_and_resolve_derived_values():
    cfg = load_config()
    arr = cfg.actor_rollout_ref
    assert isinstance(cfg, PPOConfig)
    assert cfg.algorithm.adv_estimator == "grpo"
    assert arr.rollout.name == "torch" and arr.rollout.n == 4
    assert arr.model.path == "smollm2-135m-instruct" and arr.model.dtype == "auto"
    # "null = other key" defaults are filled in once, so consumers read plain values.
    assert arr.actor.clip_ratio_low == 0.2 and arr.actor.clip_ratio_high == 0.2
    assert arr.actor.strategy == "torch"
    assert arr.rollout.response_length == cfg.data.max_response_length == 32
    assert arr.rollout.prompt_length == cfg.data.max_prompt_length == 128
    assert arr.rollout.seed == cfg.data.seed == cfg.trainer.seed == 1
    assert arr.rollout.log_prob_use_dynamic_bsz is False and arr.ref.log_prob_use_dynamic_bsz is False
    assert arr.rollout.log_prob_max_token_len_per_gpu == arr.ref.log_prob_max_token_len_per_gpu == 16384
    assert arr.actor.policy_loss.rollout_correction.rollout_rs_threshold == 2.0
    assert cfg.critic.enable is False  # grpo needs no values
    assert cfg.critic.model.path == "smollm2-135m-instruct" and cfg.critic.model.dtype == "auto"
    assert cfg.critic.ppo_mini_batch_size == 4 and cfg.critic.ppo_micro_batch_size_per_gpu == 8
    assert cfg.critic.forward_micro_batch_size_per_gpu == 8 and cfg.critic.forward_max_token_len_per_gpu == 32768
    assert cfg.critic.ppo_epochs == 1 and cfg.critic.shuffle is False and cfg.critic.loss_agg_mode == "token-mean"
    assert cfg.critic.strategy == "torch" and cfg.critic.optim.lr == 1e-5 and arr.actor.optim.lr == 1.5e-5
    assert cfg.trainer.default_local_dir == "checkpoints/hybridflow/default"
    assert cfg.trainer.logger == ("console",)


def test_critic_auto_enables_for_estimators_that_need_values():
    assert load_config(None, ["algorithm.adv_estimator=gae"]).critic.enable is True
    assert load_config(None, ["algorithm.adv_estimator=gae", "critic.enable=false"]).critic.enable is False


def test_explicit_values_win_over_derived_defaults():
    cfg = load_config(
        None,
        [
            "actor_rollout_ref.actor.clip_ratio_high=0.28",
            "actor_rollout_ref.rollout.response_length=64",
            "trainer.project_name=p",
            "trainer.experiment_name=e",
            "trainer.n_gpus_per_node=2",
        ],
    )
    actor = cfg.actor_rollout_ref.actor
    assert (actor.clip_ratio_low, actor.clip_ratio_high) == (0.2, 0.28)
    assert cfg.actor_rollout_ref.rollout.response_length == 64
    assert cfg.trainer.default_local_dir == "checkpoints/p/e"
    assert actor.strategy == "fsdp"  # auto with two processes


def test_every_key_has_help_and_a_default_of_its_own_type():
    leaves = list(iter_leaves(PPOConfig))
    assert len(leaves) > 100
    for path, f, tp in leaves:
        assert help_of(f).strip(), path
        default = default_of(f)
        converted = coerce(default, tp)
        assert converted == default and type(converted) is type(default), path


def test_config_is_frozen_and_picklable():
    cfg = load_config()
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.trainer.seed = 3  # type: ignore[misc]
    assert isinstance(cfg.trainer.logger, tuple)  # lists are stored as tuples: immutable too
    assert pickle.loads(pickle.dumps(cfg)) == cfg


def test_loading_is_deterministic():
    assert load_config(None, []) == load_config()
