"""verl command lines and files load: verl-only keys are ignored with a warning, the rest is checked."""

from __future__ import annotations

import logging
import textwrap

import pytest

from hybridflow.config import ConfigError, load_config
from hybridflow.config.verl_compat import VERL_IGNORED_KEYS, find_ignored, is_off

ARR = "actor_rollout_ref"

# verl's GSM8K GRPO quickstart (examples/grpo_trainer/run_qwen2-7b.sh) as the shell hands it over,
# with batch sizes, model, rollout engine and process count scaled to one CPU process.
GSM8K_GRPO_CPU = [
    "algorithm.adv_estimator=grpo",
    "data.train_files=/data/gsm8k/train.parquet",
    "data.val_files=/data/gsm8k/test.parquet",
    "data.train_batch_size=16",
    "data.max_prompt_length=512",
    "data.max_response_length=256",
    "data.filter_overlong_prompts=True",
    "data.truncation='error'",
    f"{ARR}.model.path=/models/smollm2",
    f"{ARR}.actor.optim.lr=1e-6",
    f"{ARR}.model.use_remove_padding=True",
    f"{ARR}.actor.ppo_mini_batch_size=8",
    f"{ARR}.actor.ppo_micro_batch_size_per_gpu=4",
    f"{ARR}.actor.use_kl_loss=True",
    f"{ARR}.actor.kl_loss_coef=0.001",
    f"{ARR}.actor.kl_loss_type=low_var_kl",
    f"{ARR}.actor.entropy_coeff=0",
    f"{ARR}.model.enable_gradient_checkpointing=True",
    f"{ARR}.actor.fsdp_config.param_offload=False",
    f"{ARR}.actor.fsdp_config.optimizer_offload=False",
    f"{ARR}.rollout.log_prob_micro_batch_size_per_gpu=8",
    f"{ARR}.rollout.tensor_model_parallel_size=2",
    f"{ARR}.rollout.name=torch",
    f"{ARR}.rollout.gpu_memory_utilization=0.6",
    f"{ARR}.rollout.n=5",
    f"{ARR}.ref.log_prob_micro_batch_size_per_gpu=8",
    f"{ARR}.ref.fsdp_config.param_offload=True",
    "algorithm.use_kl_in_reward=False",
    "trainer.critic_warmup=0",
    "trainer.logger=['console']",
    "trainer.project_name='verl_grpo_example_gsm8k'",
    "trainer.experiment_name='qwen2_7b_function_rm'",
    "trainer.n_gpus_per_node=1",
    "trainer.nnodes=1",
    "trainer.save_freq=20",
    "trainer.test_freq=5",
    "trainer.total_epochs=15",
]


def test_gsm8k_grpo_quickstart_parses(caplog):
    with caplog.at_level(logging.WARNING, logger="hybridflow.config"):
        cfg = load_config(None, GSM8K_GRPO_CPU)
    arr = cfg.actor_rollout_ref
    assert cfg.algorithm.adv_estimator == "grpo" and cfg.algorithm.use_kl_in_reward is False
    assert cfg.data.train_files == ("/data/gsm8k/train.parquet",) and cfg.data.truncation == "error"
    assert cfg.data.filter_overlong_prompts is True and cfg.data.train_batch_size == 16
    assert arr.model.path == "/models/smollm2" and arr.model.enable_gradient_checkpointing is True
    assert arr.model.use_remove_padding is True  # honoured now: packed micro-batches
    assert arr.actor.use_kl_loss is True and arr.actor.kl_loss_type == "low_var_kl" and arr.actor.kl_loss_coef == 0.001
    assert arr.actor.entropy_coeff == 0.0 and arr.actor.optim.lr == 1e-6
    assert arr.rollout.n == 5 and arr.rollout.response_length == 256
    assert cfg.trainer.logger == ("console",) and cfg.trainer.project_name == "verl_grpo_example_gsm8k"
    assert cfg.trainer.default_local_dir == "checkpoints/verl_grpo_example_gsm8k/qwen2_7b_function_rm"
    assert (cfg.trainer.save_freq, cfg.trainer.test_freq, cfg.trainer.total_epochs) == (20, 5, 15)
    ignored = [r.getMessage() for r in caplog.records if r.getMessage().startswith("ignored: ")]
    assert ignored == [
        f"ignored: {ARR}.actor.fsdp_config (FSDP wrapping/offload knobs; hybridflow's engines choose their own sharding)",
        f"ignored: {ARR}.ref.fsdp_config (FSDP wrapping/offload knobs; hybridflow's engines choose their own sharding)",
    ]


def test_verl_style_yaml_file_with_ignored_and_switched_off_sections(tmp_path, caplog):
    path = tmp_path / "verl.yaml"
    path.write_text(
        textwrap.dedent(
            """
            data:
              custom_cls: {path: null, name: null}
              return_raw_input_ids: false
            actor_rollout_ref:
              hybrid_engine: true
              actor:
                _target_: verl.workers.config.FSDPActorConfig
                checkpoint: {save_contents: [model, optimizer, extra]}
                optim: {warmup_style: cosine, lr: 2e-6}
            algorithm:
              rollout_correction: {rollout_is: null, bypass_mode: false}
            trainer:
              logger: ["console", "wandb"]
            """
        )
    )
    with caplog.at_level(logging.WARNING, logger="hybridflow.config"):
        cfg = load_config([str(path)])
    assert cfg.actor_rollout_ref.actor.optim.lr_scheduler_type == "cosine"  # verl's old name, renamed
    assert cfg.actor_rollout_ref.actor.optim.lr == 2e-6
    assert cfg.trainer.logger == ("console", "wandb")
    messages = [r.getMessage() for r in caplog.records]
    assert f"renamed: {ARR}.actor.optim.warmup_style is read as {ARR}.actor.optim.lr_scheduler_type" in messages
    ignored_keys = sorted(m.split()[1] for m in messages if m.startswith("ignored: "))
    assert ignored_keys == sorted(
        [
            "data.custom_cls",
            "data.return_raw_input_ids",
            f"{ARR}.hybrid_engine",
            f"{ARR}.actor._target_",
            f"{ARR}.actor.checkpoint",
        ]
    )


def test_unsupported_verl_features_are_errors_once_switched_on():
    with pytest.raises(ConfigError) as info:
        load_config(None, ["data.custom_cls.path=my_dataset.py"])
    assert info.value.problems == [
        "data.custom_cls: not supported by hybridflow (custom dataset classes are not supported)",
    ]


def test_renamed_and_new_name_together_is_an_error():
    with pytest.raises(ConfigError, match=r"optim\.warmup_style: verl's name for .*lr_scheduler_type; give only one"):
        load_config(None, [f"{ARR}.actor.optim.warmup_style=cosine", f"{ARR}.actor.optim.lr_scheduler_type=constant"])


@pytest.mark.parametrize(
    ("path", "listed"),
    [
        (f"{ARR}.actor.fsdp_config", True),
        (f"{ARR}.actor.fsdp_config.wrap_policy.min_num_params", True),
        ("critic.model.fsdp_config.param_offload", True),
        (f"{ARR}.rollout.engine_kwargs.trtllm", True),
        (f"{ARR}.model.lora.merge", True),
        ("ray_kwargs.ray_init.num_cpus", True),
        ("trainer.use_legacy_worker_impl", True),
        ("trainer.seedx", False),
        (f"{ARR}.rollout.temperature_x", False),
    ],
)
def test_ignore_patterns(path, listed):
    assert (find_ignored(path) is not None) is listed


def test_is_off():
    assert is_off(None) and is_off(False) and is_off({}) and is_off([]) and is_off({"a": None, "b": {"c": False}})
    assert not is_off(0.0) and not is_off("x") and not is_off({"a": None, "b": 1})


def test_every_ignore_entry_has_a_reason():
    assert all(entry.reason.strip() for entry in VERL_IGNORED_KEYS)


@pytest.mark.parametrize("value", ["true", "false"])
def test_verl_trainer_v1_switch_runs_the_one_trainer_core(value, caplog):
    """verl's trainer.use_v1 selects its replay-buffer trainer; hybridflow has only that design,
    so either value loads (with a note) and builds the same config."""
    config = load_config(None, [f"trainer.use_v1={value}"])
    assert config == load_config(None, [])
    assert any("ignored: trainer.use_v1" in r.getMessage() for r in caplog.records)
