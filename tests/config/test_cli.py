"""`hybridflow config` (`-m hybridflow.entrypoints.config`) prints the resolved config; bad configs exit 2."""

from __future__ import annotations

import subprocess
import sys

import yaml

from hybridflow.entrypoints.config import main

ARR = "actor_rollout_ref"


def test_prints_resolved_yaml(tmp_path, capsys):
    path = tmp_path / "run.yaml"
    path.write_text("algorithm:\n  adv_estimator: rloo\n")
    assert main(["--config", str(path), f"{ARR}.rollout.n=6", "trainer.logger=[console,jsonl]"]) == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["algorithm"]["adv_estimator"] == "rloo"
    assert printed[ARR]["rollout"]["n"] == 6
    assert printed[ARR]["actor"]["clip_ratio_low"] == 0.2  # resolved, not null
    assert printed["trainer"]["logger"] == ["console", "jsonl"]


def test_invalid_config_exits_2_with_the_problems(capsys):
    assert main([f"{ARR}.rollout.top_p=3", "trainer.sed=1"]) == 2
    err = capsys.readouterr().err
    assert "trainer.sed: unknown key; did you mean trainer.seed?" in err


def test_module_entry_point_runs():
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "hybridflow.entrypoints.config",
            "algorithm.adv_estimator=gae",
            "trainer.esi_redundant_time=0",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert yaml.safe_load(result.stdout)["critic"]["enable"] is True
    assert "ignored: trainer.esi_redundant_time (elastic-server checkpoint timing)" in result.stderr


def test_sft_trainer_config_with_verls_engine_keys(capsys):
    assert main(["--trainer", "sft", "data.messages_key=conversation", "data.max_length=512"]) == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["data"]["multiturn"]["messages_key"] == "conversation" and printed["data"]["max_length"] == 512
    assert "actor_rollout_ref" not in printed
    assert main(["data.max_length=512"]) == 2  # a PPO config has no data.max_length


def test_printed_config_reloads_to_the_same_config(tmp_path, capsys):
    from hybridflow.config import finalize_ppo_config, load_config

    overrides = ["algorithm.adv_estimator=gae", "trainer.experiment_name=x", f"{ARR}.actor.clip_ratio_high=0.3"]
    assert main(overrides) == 0
    saved = tmp_path / "resolved.yaml"
    saved.write_text(capsys.readouterr().out)
    cfg = load_config(None, overrides)
    assert load_config([str(saved)]) == cfg
    assert finalize_ppo_config(cfg) == cfg  # resolving twice changes nothing
