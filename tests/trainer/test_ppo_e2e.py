"""End-to-end PPO-family runs on the tiny model: every estimator, KL variants, resume, faults."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from hybridflow.algorithms.advantages import ADV_ESTIMATORS
from hybridflow.config import load_config
from hybridflow.entrypoints.train import build_trainer, run

from .conftest import cut_then_resume, tiny_overrides


def _rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]


def _run(tiny_task_dir, tmp_path, tiny_model_dir, *extra: str) -> list[dict]:
    run_dir = tmp_path / "run"
    run(load_config(None, tiny_overrides(tiny_task_dir, run_dir, tiny_model_dir, *extra)))
    return _rows(run_dir)


@pytest.mark.parametrize("estimator", ADV_ESTIMATORS.names())
def test_every_estimator_runs_two_steps(estimator, tiny_task_dir, tmp_path, tiny_model_dir):
    rows = _run(tiny_task_dir, tmp_path, tiny_model_dir, f"algorithm.adv_estimator={estimator}")
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        assert math.isfinite(r["actor/pg_loss"])
        assert 0.0 <= r["critic/score/mean"] <= 1.0
        assert r["response_length/mean"] > 0
    if estimator == "gae":
        assert "critic/vf_loss" in rows[-1] and "critic/values/mean" in rows[-1]
    if estimator == "remax":
        assert "timing_s/gen_baseline" in rows[-1]


def test_gae_with_the_critic_in_its_own_processes(tiny_task_dir, tmp_path, tiny_model_dir):
    rows = _run(tiny_task_dir, tmp_path, tiny_model_dir, "algorithm.adv_estimator=gae", "trainer.critic_placement=separate")
    assert [r["step"] for r in rows] == [1, 2] and math.isfinite(rows[-1]["critic/vf_loss"])


def test_grpo_with_kl_loss(tiny_task_dir, tmp_path, tiny_model_dir):
    rows = _run(tiny_task_dir, tmp_path, tiny_model_dir,
                "actor_rollout_ref.actor.use_kl_loss=true", "actor_rollout_ref.actor.kl_loss_coef=0.1")
    assert "timing_s/ref" in rows[0]
    assert rows[0]["actor/kl_loss"] == pytest.approx(0.0, abs=1e-6)  # step 1: actor == reference
    assert rows[1]["actor/kl_loss"] > 0.0  # the policy has moved


def test_grpo_with_kl_in_reward(tiny_task_dir, tmp_path, tiny_model_dir):
    rows = _run(tiny_task_dir, tmp_path, tiny_model_dir,
                "algorithm.use_kl_in_reward=true", "algorithm.kl_ctrl.kl_coef=0.5", "algorithm.kl_penalty=low_var_kl")
    assert rows[0]["actor/reward_kl_penalty_coeff"] == pytest.approx(0.5)
    assert "timing_s/old_log_prob" in rows[0] and "timing_s/ref" in rows[0]
    assert rows[0]["actor/reward_kl_penalty"] == pytest.approx(0.0, abs=1e-6)  # actor == reference
    assert rows[1]["actor/reward_kl_penalty"] > 0.0  # k3 ≥ 0, and the policy has moved


def test_validation_and_plot(tiny_task_dir, tmp_path, tiny_model_dir):
    rows = _run(tiny_task_dir, tmp_path, tiny_model_dir, "trainer.val_before_train=true", "trainer.test_freq=1")
    assert rows[0]["step"] == 0 and "val-core/hybridflow/arithmetic/reward/mean@1" in rows[0]
    # one data source: the overall mean is its reward mean, whatever val-aux columns the scorer adds
    assert all(r["val-core/mean"] == r["val-core/hybridflow/arithmetic/reward/mean@1"] for r in rows if "val-core/mean" in r)
    assert all("val-core/mean" in r for r in rows)
    assert (tmp_path / "run" / "curves.png").stat().st_size > 1000


def _final_weights(run_dir: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    latest = (run_dir / "latest_checkpointed_iteration.txt").read_text()
    return load_file(run_dir / f"global_step_{latest}" / "actor" / "model.safetensors")


def test_resume_equals_uninterrupted(tiny_task_dir, tmp_path, tiny_model_dir, monkeypatch):
    # two shuffled mini-batches per step: the actor's shuffling RNG must be restored too
    common = ("trainer.total_training_steps=4", "trainer.save_freq=2", "actor_rollout_ref.actor.use_kl_loss=true",
              "actor_rollout_ref.actor.ppo_mini_batch_size=2", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
              "actor_rollout_ref.actor.shuffle=true")
    full_dir, cut_dir = tmp_path / "full", tmp_path / "cut"
    run(load_config(None, tiny_overrides(tiny_task_dir, full_dir, tiny_model_dir, *common)))

    cut_then_resume(lambda: run(load_config(None, tiny_overrides(tiny_task_dir, cut_dir, tiny_model_dir, *common))),
                    monkeypatch)

    def comparable(rows):
        return [{k: v for k, v in r.items() if not k.startswith(("timing_s/", "perf/"))} for r in rows]

    # bitwise by construction: both runs in this process with the same kernels; an exact resume
    # restores every weight, optimizer moment and RNG state
    assert comparable(_rows(cut_dir)) == comparable(_rows(full_dir))
    a, b = _final_weights(full_dir), _final_weights(cut_dir)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_resuming_a_finished_run_says_so(tiny_task_dir, tmp_path, tiny_model_dir, capsys):
    overrides = tiny_overrides(tiny_task_dir, tmp_path / "run", tiny_model_dir, "trainer.save_freq=2")
    run(load_config(None, overrides))
    run(load_config(None, overrides))
    assert "training already finished" in capsys.readouterr().out


FAULTY_SCORER = '''
import math, time
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    i = int(extra_info["index"])
    if i % 4 == 0:
        raise RuntimeError("scorer bug")
    if i % 4 == 1:
        return float("nan")
    if i % 4 == 2:
        time.sleep(30)
    return 1.0
'''


def test_reward_faults_are_contained(tiny_task_dir, tmp_path, tiny_model_dir):
    scorer = tmp_path / "faulty.py"
    scorer.write_text(FAULTY_SCORER)
    rows = _run(tiny_task_dir, tmp_path, tiny_model_dir, f"custom_reward_function.path={scorer}",
                "reward_model.timeout_s=1", "trainer.total_training_steps=1")
    assert rows[0]["reward/errors"] > 0 and rows[0]["reward/timeouts"] > 0
    assert 0.0 <= rows[0]["critic/score/mean"] <= 1.0


def test_malformed_dataset_row_is_named(tmp_path, tiny_model_dir):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"data_source": "hybridflow/arithmetic", "prompt": "not a list",
                               "reward_model": {"style": "rule", "ground_truth": "1"}}) + "\n")
    cfg = load_config(None, tiny_overrides(bad.parent, tmp_path / "run", tiny_model_dir,
                                           f"data.train_files=[{bad}]", "data.val_files=[]"))
    with pytest.raises(ValueError, match=r"bad\.jsonl.*row 0.*prompt"):
        build_trainer(cfg)


GSM8K_ROWS = [
    {"question": "Tom has 3 apples and buys 4 more. How many apples does he have?",
     "answer": "3 + 4 = 7\n#### 7"},
    {"question": "A box holds 5 pens. How many pens are in 2 boxes?", "answer": "5 * 2 = 10\n#### 10"},
]


def test_verl_gsm8k_quickstart_command_line(tmp_path, tiny_model_dir):
    """verl's GSM8K GRPO quickstart overrides (the CPU-applicable ones) run unchanged."""
    from hybridflow.data.io import write_rows
    from hybridflow.entrypoints.data import main as data_main

    raw = tmp_path / "raw"
    raw.mkdir()
    write_rows(GSM8K_ROWS * 2, raw / "train.jsonl")
    write_rows(GSM8K_ROWS, raw / "test.jsonl")
    out = tmp_path / "gsm8k"
    assert data_main(["gsm8k", "--out", str(out), "--train", str(raw / "train.jsonl"),
                      "--test", str(raw / "test.jsonl")]) == 0
    from hybridflow.entrypoints.train import main

    argv = [
        "algorithm.adv_estimator=grpo",
        f"data.train_files={out / 'train.parquet'}",
        f"data.val_files={out / 'test.parquet'}",
        "data.train_batch_size=4",
        "data.max_prompt_length=256",
        "data.max_response_length=8",
        "data.filter_overlong_prompts=True",
        "data.truncation=error",
        f"actor_rollout_ref.model.path={tiny_model_dir}",
        "actor_rollout_ref.actor.optim.lr=1e-6",
        "actor_rollout_ref.model.use_remove_padding=True",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
        "actor_rollout_ref.actor.use_kl_loss=True",
        "actor_rollout_ref.actor.kl_loss_coef=0.001",
        "actor_rollout_ref.actor.kl_loss_type=low_var_kl",
        "actor_rollout_ref.actor.entropy_coeff=0",
        "actor_rollout_ref.model.enable_gradient_checkpointing=True",
        "actor_rollout_ref.actor.fsdp_config.param_offload=False",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
        "actor_rollout_ref.rollout.gpu_memory_utilization=0.6",
        "actor_rollout_ref.rollout.n=2",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4",
        "algorithm.use_kl_in_reward=False",
        "trainer.critic_warmup=0",
        "trainer.logger=['console']",
        "trainer.project_name=verl_grpo_example_gsm8k",
        "trainer.experiment_name=qwen2_7b_function_rm",
        "trainer.n_gpus_per_node=1",
        "trainer.nnodes=1",
        "trainer.save_freq=-1",
        "trainer.test_freq=1",
        f"trainer.default_local_dir={tmp_path / 'run'}",
        "trainer.total_epochs=1",
    ]
    assert main(argv) == 0
    rows = _rows(tmp_path / "run")
    assert [r["step"] for r in rows] == [0, 1]
    assert "val-core/openai/gsm8k/reward/mean@1" in rows[-1]
