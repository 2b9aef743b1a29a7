"""GRPO with a reward model on the tiny models: its scores are the reward, the rule scorer
logs beside it (rule_reward=log), in-process and as its own Ray worker group."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from hybridflow.config import load_config
from hybridflow.entrypoints.train import run
from hybridflow.models.reward_model import reward_model_from_lm

from .conftest import tiny_overrides


@pytest.fixture(scope="module")
def tiny_rm_dir(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("rm") / "rm"
    model, tokenizer = reward_model_from_lm("tiny-llama", seed=5)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def _run(tiny_task_dir, tmp_path, tiny_model_dir, tiny_rm_dir, *extra: str) -> list[dict]:
    run_dir = tmp_path / "run"
    run(load_config(None, tiny_overrides(
        tiny_task_dir, run_dir, tiny_model_dir, "custom_reward_function.path=null", "reward_model.enable=true",
        f"reward_model.model.path={tiny_rm_dir}", "reward_model.model.dtype=fp32", *extra,
    )))
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]


def test_grpo_on_reward_model_scores_with_the_rule_logged(tiny_task_dir, tmp_path, tiny_model_dir, tiny_rm_dir):
    rows = _run(tiny_task_dir, tmp_path, tiny_model_dir, tiny_rm_dir, "reward_model.rule_reward=log",
                "trainer.test_freq=2")
    assert [r["step"] for r in rows if "actor/pg_loss" in r] == [1, 2]
    for r in rows:
        if "actor/pg_loss" not in r:
            continue
        assert 0.0 <= r["critic/rule_score/mean"] <= 1.0  # the rule's view of the same responses
        # the reward is the model's score: a tiny random head scores near 0 but not in {0, 1}
        assert math.isfinite(r["critic/score/mean"]) and r["critic/score/mean"] not in (0.0, 1.0)
    val = rows[-1]
    assert "val-aux/hybridflow/arithmetic/rule_score/mean@1" in val
    assert "val-core/hybridflow/arithmetic/reward/mean@1" in val


@pytest.mark.ray
def test_reward_model_in_its_own_ray_pool(ray_session, tiny_task_dir, tmp_path, tiny_model_dir, tiny_rm_dir):
    rows = _run(tiny_task_dir, tmp_path, tiny_model_dir, tiny_rm_dir, "trainer.backend=ray", "trainer.test_freq=-1",
                "data.val_files=[]", "reward_model.enable_resource_pool=true", "reward_model.n_gpus_per_node=1",
                "reward_model.nnodes=1")
    assert [r["step"] for r in rows] == [1, 2]
    assert all(math.isfinite(r["critic/score/mean"]) and "critic/rule_score/mean" not in r for r in rows)


def test_a_served_judge_is_asked_by_the_custom_reward_function(tiny_task_dir, tmp_path, tiny_model_dir):
    """verl's generative RM: reward_model.enable + a custom function → the model is served and
    the function gets reward_router_address; the judge process is stopped with the run."""
    import psutil

    run_dir = tmp_path / "run"
    judge_file = Path(__file__).with_name("judge_prob_reward.py")
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    run(load_config(None, tiny_overrides(
        tiny_task_dir, run_dir, tiny_model_dir, f"custom_reward_function.path={judge_file}",
        "reward_model.enable=true", f"reward_model.model.path={tiny_model_dir}", "reward_model.model.dtype=fp32",
        "trainer.test_freq=-1", "data.val_files=[]", "trainer.total_training_steps=1",
    )))
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    assert rows[0]["reward/errors"] == 0.0 and rows[0]["reward/timeouts"] == 0.0
    assert 0.0 < rows[0]["critic/score/mean"] <= 1.0  # a probability from the judge, for every row
    left = [p for p in psutil.Process().children(recursive=True) if p.pid not in before and p.is_running()
            and "hybridflow.entrypoints.serve" in " ".join(p.cmdline())]
    assert not left
