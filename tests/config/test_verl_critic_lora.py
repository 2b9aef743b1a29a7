"""verl's critic LoRA keys (issue 30): the flat ``critic.model.lora_rank/lora_alpha/target_modules``
are ours, and verl's ``critic.model.lora.*`` section moves onto them as the actor's does."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
import yaml

from hybridflow.config import ConfigError, load_config
from hybridflow.config.ppo import PPOConfig
from hybridflow.config.verl_keys import explain_verl_key

CPU = "trainer.device=cpu"


def _load(tmp_path: Path, tree: dict[str, Any], overrides: tuple[str, ...] = ()) -> PPOConfig:
    path = tmp_path / "verl.yaml"
    path.write_text(yaml.safe_dump(tree), encoding="utf-8")
    return load_config([str(path)], [CPU, *overrides])


def test_defaults_are_verls_and_leave_lora_off():
    model = load_config(None, [CPU]).critic.model
    assert (model.lora_rank, model.lora_alpha, model.target_modules) == (0, 16.0, "all-linear")


def test_section_override_lands_on_the_flat_keys():
    model = load_config(None, [CPU, "critic.model.lora.rank=4"]).critic.model
    assert model.lora_rank == 4 and model.lora_alpha == 16.0 and model.target_modules == "all-linear"


def test_section_in_a_file_lands_on_the_flat_keys(tmp_path):
    lora = {"rank": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"], "type": "lora", "dropout": 0.0}
    model = _load(tmp_path, {"critic": {"model": {"lora": lora}}}).critic.model
    assert (model.lora_rank, model.lora_alpha, model.target_modules) == (4, 8.0, ("q_proj", "v_proj"))


def test_flat_keys_are_honoured():
    cfg = load_config(None, [CPU, "critic.model.lora_rank=8", "critic.model.lora_alpha=32"])
    assert (cfg.critic.model.lora_rank, cfg.critic.model.lora_alpha) == (8, 32.0)
    assert cfg.actor_rollout_ref.model.lora_rank == 0  # the critic's rank is its own, not the actor's


@pytest.mark.parametrize(
    "key, status, ours",
    [
        ("critic.model.lora_rank", "honoured", "critic.model.lora_rank"),
        ("critic.model.lora_alpha", "honoured", "critic.model.lora_alpha"),
        ("critic.model.target_modules", "honoured", "critic.model.target_modules"),
        ("critic.model.lora.rank", "moved", "critic.model.lora_rank"),
        ("critic.model.lora.alpha", "moved", "critic.model.lora_alpha"),
        ("critic.model.lora.target_modules", "moved", "critic.model.target_modules"),
        ("critic.model.lora.exclude_modules", "moved", "critic.model.exclude_modules"),
        ("critic.model.lora.type", "off_only", ""),
        ("critic.model.lora.merge", "ignored", ""),
    ],
)
def test_fate_of_each_key(key, status, ours):
    fate = explain_verl_key(key)
    assert (fate.status, fate.ours) == (status, ours)


def test_megatron_section_with_rank_0_is_dropped(tmp_path, caplog):
    tree = {"critic": {"model": {"lora_alpha": 16, "lora": {"rank": 0, "alpha": 32, "type": "lora"}}}}
    with caplog.at_level(logging.WARNING, logger="hybridflow.config"):
        model = _load(tmp_path, tree).critic.model
    assert (model.lora_rank, model.lora_alpha) == (0, 16.0)  # the FSDP key wins; the section is off
    assert any(
        r.getMessage() == "ignored: critic.model.lora (its rank is 0, so none of its settings is used; "
        "LoRA follows critic.model.lora_rank)"
        for r in caplog.records
    )


@pytest.mark.parametrize(
    "overrides, message",
    [
        (
            ("critic.model.lora.rank=4", "critic.model.lora_rank=8"),
            "critic.model.lora.rank=4 and critic.model.lora_rank=8 set the same thing; give one",
        ),
        (
            ("critic.model.lora.rank=4", "critic.model.lora.exclude_modules=[v_proj]"),
            "critic.model.exclude_modules: not supported by hybridflow (LoRA module exclusion is not supported)",
        ),
        (
            ("critic.model.lora.rank=4", "critic.model.lora.type=dora"),
            "critic.model.lora.type: not supported by hybridflow (the LoRA variant is plain LoRA)",
        ),
        (("critic.model.lora_rank=-1",), "critic.model.lora_rank: must be ≥ 0, got -1"),
        (("critic.model.lora_alpha=0",), "critic.model.lora_alpha: must be > 0, got 0.0"),
    ],
)
def test_bad_critic_lora_settings_are_errors(overrides, message):
    with pytest.raises(ConfigError) as err:
        load_config(None, [CPU, *overrides])
    assert message in str(err.value)
