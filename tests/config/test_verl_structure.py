"""A config file in the structure of verl's generated full PPO config loads, and each of its
keys lands where it should (fixtures/verl_structure.yaml)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from hybridflow.config import ConfigError, load_config
from hybridflow.config.sources import hydra_config_file

FIXTURE = Path(__file__).with_name("fixtures") / "verl_structure.yaml"
CPU = ["trainer.device=cpu", "trainer.n_gpus_per_node=1", "trainer.logger=[console]"]


def test_verls_structure_loads_into_a_valid_cpu_run_config(caplog):
    with caplog.at_level(logging.WARNING, logger="hybridflow.config"):
        cfg = load_config([str(FIXTURE)], CPU)
    arr, actor = cfg.actor_rollout_ref, cfg.actor_rollout_ref.actor
    # honoured as they are
    assert arr.model.path == "/models/small" and arr.model.use_remove_padding is True
    assert actor.optim.lr == 2e-6 and actor.clip_ratio_high == 0.28 and arr.rollout.n == 2
    assert actor.data_loader_seed == 42 and cfg.critic.data_loader_seed == 7
    # moved to our names
    assert actor.grad_clip == 0.8 and cfg.critic.grad_clip == 1.0
    assert (actor.policy_loss.tau_pos, actor.policy_loss.tau_neg) == (1.5, 1.25)
    assert cfg.data.max_samples == 96 and cfg.reward_model.reward_manager == "naive"
    # verl's null = the default
    assert actor.ppo_micro_batch_size_per_gpu == 8 and arr.ref.log_prob_micro_batch_size_per_gpu == 8
    assert arr.rollout.log_prob_micro_batch_size_per_gpu == 8
    # interpolations over verl's own keys resolved before any key is judged
    assert arr.rollout.prompt_length == 96 and arr.rollout.response_length == 32
    assert cfg.trainer.default_local_dir == "checkpoints/verl_examples/gsm8k"
    warned = {r.getMessage().split(" (")[0] for r in caplog.records}
    for key in ("ignored: data.dataloader_num_workers", "ignored: actor_rollout_ref.rollout.gpu_memory_utilization",
                "ignored: actor_rollout_ref.actor.calculate_entropy",
                "ignored: actor_rollout_ref.actor.router_replay", "ignored: actor_rollout_ref.model.mtp"):
        assert key in warned, key


@pytest.mark.parametrize(
    "override, message",
    [
        ("actor_rollout_ref.actor.router_replay.mode=record", "router_replay: not supported"),
        ("actor_rollout_ref.model.mtp.enable=true", "mtp: not supported"),
        ("actor_rollout_ref.actor.optim.optimizer=SGD", "optimizer: not supported by hybridflow (the optimizer is torch's AdamW)"),
        ("reward_manager.module.path=/x.py", "reward_manager: not supported"),
        ("actor_rollout_ref.actor.loss_scale_factor=2.0", "loss_scale_factor: not supported"),
        ("actor_rollout_ref.actor.grad_clip=0.5", "optim.clip_grad=0.8 and actor_rollout_ref.actor.grad_clip=0.5"),
    ],
)
def test_features_switched_on_in_that_structure_are_refused(override, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_config([str(FIXTURE)], CPU + [override])


def test_hydra_style_config_path_and_name(tmp_path):
    assert hydra_config_file(str(FIXTURE.parent), "verl_structure") == str(FIXTURE)
    assert hydra_config_file(None, None) is None
    with pytest.raises(ConfigError, match="--config-path needs --config-name"):
        hydra_config_file("conf", None)
    cfg = load_config([hydra_config_file(str(FIXTURE.parent), "verl_structure.yaml")], CPU)
    assert cfg.actor_rollout_ref.model.path == "/models/small"


def test_verls_reward_model_section_switched_on_loads_with_its_keys_honoured():
    cfg = load_config([str(FIXTURE)], CPU + ["reward_model.enable=true", "reward_model.micro_batch_size_per_gpu=2"])
    rm = cfg.reward_model
    assert rm.enable and rm.model.path == "~/models/reward" and rm.micro_batch_size_per_gpu == 2
    assert rm.enable_resource_pool is False and rm.max_length is None
