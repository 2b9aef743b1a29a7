"""``hybridflow train`` on two Ray ranks (FSDP2, gloo): a GRPO run, a rank that dies, resume, merge.

The runs use the session's Ray instance (``ray_session``), as a driver that stays up while its
ranks come and go: each run starts its own two rank processes and gives them back at its end."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from hybridflow.engine.fsdp_checkpoint import FSDP_META_FILE, read_full_model_state
from hybridflow.export.writer import merge_checkpoint
from tests.scale.ppo_run import train

pytestmark = pytest.mark.ray


def _overrides(task_dir: Path, run_dir: Path, model_dir: Path) -> list[str]:
    return [
        f"data.train_files=[{task_dir / 'train.parquet'}]",
        f"data.val_files=[{task_dir / 'test.parquet'}]",
        "data.train_batch_size=4",
        "data.max_prompt_length=96",
        "data.max_response_length=8",
        f"actor_rollout_ref.model.path={model_dir}",
        "actor_rollout_ref.model.dtype=fp32",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2",  # 2 optimizer steps per update: ℓ_old is computed
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.actor.optim.lr=1e-3",
        "actor_rollout_ref.rollout.n=2",
        "actor_rollout_ref.rollout.calculate_log_probs=true",  # keeps rollout_log_probs: the mismatch metric
        "algorithm.adv_estimator=grpo",
        f"custom_reward_function.path={Path(__file__).parent / 'length_reward.py'}",
        "trainer.backend=ray",
        "trainer.n_gpus_per_node=2",
        "trainer.total_training_steps=3",
        "trainer.save_freq=1",
        "trainer.val_before_train=false",
        "trainer.test_freq=-1",
        "trainer.logger=[jsonl]",
        f"trainer.default_local_dir={run_dir}",
    ]


def test_grpo_on_two_ranks_survives_a_dead_rank_and_resumes(
    ray_session, tiny_task_dir, tiny_model_dir, tmp_path
) -> None:
    run_dir = tmp_path / "run"
    overrides = _overrides(tiny_task_dir, run_dir, tiny_model_dir)

    # Steps 1 and 2 train and checkpoint; rank 1's process is killed before step 3.
    crashed = train(overrides, kill_rank=1, at_step=3)
    assert not crashed["finished"] and crashed["error"] == "WorkerDiedError" and crashed["rank"] == 1
    assert f"pid {crashed['pids'][1]} on {crashed['nodes'][1]}" in crashed["message"]  # rank, node, cause
    assert "rank 1 died" in crashed["message"] and "ActorDiedError" in crashed["message"]
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    assert rows[0]["actor/grad_norm"] > 0  # the reward varies within groups: the policy moved
    # each rank's rollout samples from its own full copy, refreshed after every update: its
    # log-probs match the actor's recomputation even though the weights changed at step 1
    assert rows[1]["rollout/actor_logprob_diff"] < 1e-3
    assert (run_dir / "latest_checkpointed_iteration.txt").read_text() == "2"
    last = run_dir / "global_step_2" / "actor"
    assert (last / FSDP_META_FILE).is_file() and not (run_dir / "global_step_3").exists()
    saved = read_full_model_state(last)  # the last checkpoint is intact and readable

    resumed = train(overrides)  # resume_mode=auto: continue from global_step_2 on two new ranks
    assert resumed["finished"] and resumed["global_steps"] == 3
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert rows[2]["rollout/actor_logprob_diff"] < 1e-3  # the rollout pulled the resumed weights
    step3 = read_full_model_state(run_dir / "global_step_3" / "actor")
    assert any(not torch.equal(step3[n], t) for n, t in saved.items())

    exported = merge_checkpoint(run_dir, tmp_path / "hf")  # run folder → latest step → actor/
    model = AutoModelForCausalLM.from_pretrained(exported, local_files_only=True)
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, step3[name]), name
