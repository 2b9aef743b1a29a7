"""The SFT config: generated YAML and doc table in step, verl's SFT keys, derived defaults, rules."""

from __future__ import annotations

import logging
import re

import pytest

from hybridflow.config import ConfigError, SFTConfig, load_sft_config
from hybridflow.config.generate import SFT_DOC, SFT_DOC_REGIONS, SFT_YAML, expected_sft_yaml, fill_regions
from hybridflow.config.render import leaf_paths
from hybridflow.config.sources import read_yaml_file

FIX = "run `python -m hybridflow.config.generate`"


def test_sft_yaml_and_doc_table_are_up_to_date():
    assert SFT_YAML.read_text(encoding="utf-8") == expected_sft_yaml(), f"sft_trainer.yaml is stale: {FIX}"
    doc = SFT_DOC.read_text(encoding="utf-8")
    assert fill_regions(doc, SFT_DOC_REGIONS, SFT_DOC) == doc, f"docs/sft.md is stale: {FIX}"
    documented = set(re.findall(r"^\| `([a-z_.]+)` \|", doc, flags=re.M))
    assert [path for path in leaf_paths(SFTConfig) if path not in documented] == []


def test_sft_yaml_loads_back_to_the_defaults():
    assert load_sft_config([str(SFT_YAML)]) == load_sft_config()
    tree = read_yaml_file(SFT_YAML)
    assert tree["optim"]["lr"] == 1e-5
    assert tree["optim"]["betas"] == [0.9, 0.95]
    assert tree["trainer"]["default_local_dir"] is None  # resolved at load, not in the file


def test_defaults_and_derived_values():
    cfg = load_sft_config(None, ["trainer.seed=7", "trainer.experiment_name=demo"])
    assert cfg.data.seed == 7
    assert cfg.model.strategy == "torch"
    assert cfg.trainer.default_local_dir == "checkpoints/hybridflow/demo"
    assert cfg.optim.lr_scheduler_type == "cosine" and cfg.optim.lr_warmup_steps_ratio == 0.1
    assert cfg.optim.clip_grad == 1.0
    assert (cfg.data.prompt_key, cfg.data.response_key, cfg.data.truncation) == ("prompt", "response", "error")


def test_verl_sft_keys_are_read(tmp_path, caplog):
    verl_yaml = tmp_path / "verl_sft.yaml"
    verl_yaml.write_text(
        "data:\n  micro_batch_size: null\n  chat_template: null\n  balance_dp_token: false\n"
        "  prompt_dict_keys: null\n  multiturn:\n    enable: false\n    tools_key: null\n"
        "model:\n  partial_pretrain: /models/x\n  use_liger: false\n  fsdp_config:\n    cpu_offload: false\n"
        "optim:\n  warmup_steps_ratio: 0.05\n  lr_scheduler: constant\n  clip_grad: 0.5\n"
        "ulysses_sequence_parallel_size: 1\nuse_remove_padding: false\n"
    )
    with caplog.at_level(logging.WARNING, logger="hybridflow.config"):
        cfg = load_sft_config([str(verl_yaml)])
    assert cfg.model.path == "/models/x"
    assert (cfg.optim.lr_warmup_steps_ratio, cfg.optim.lr_scheduler_type, cfg.optim.clip_grad) == (0.05, "constant", 0.5)
    assert "renamed: model.partial_pretrain is read as model.path" in caplog.text
    assert "ignored: ulysses_sequence_parallel_size" in caplog.text


@pytest.mark.parametrize(
    ("overrides", "problem"),
    [
        (["data.chat_template='{{ x }}'"], "data.chat_template: not supported by hybridflow (use model.custom_chat_template)"),
        (["data.max_lenght=10"], "data.max_lenght: unknown key; did you mean data.max_length?"),
        (["data.truncation=middle"], "data.truncation: must be one of 'error', 'left', 'right'; got str 'middle'"),
        (["data.max_length=1"], "data.max_length: must be ≥ 2, got 1"),
        (["trainer.nnodes=2"], "the SFT trainer runs in one process"),
        (["data.use_dynamic_bsz=true", "data.max_token_len_per_gpu=512"], "data.max_token_len_per_gpu=512 is below data.max_length=1024"),
        (["data.train_files=[]"], "data.train_files must name at least one file"),
        (["optim.betas=[0.9]"], "optim.betas must be two numbers in [0, 1)"),
        (["trainer.resume_mode=resume_path"], "trainer.resume_from_path must be set"),
    ],
)
def test_bad_values_are_named(overrides, problem):
    with pytest.raises(ConfigError) as err:
        load_sft_config(None, overrides)
    assert problem in str(err.value)
