"""Asynchronous training end to end on the tiny model: staleness 0 trains exactly the synchronous
run, one-step-off trains every batch one version late, fully async stays within its bound,
and a resumed run trains no prompt twice."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hybridflow.config import ConfigError, load_config
from hybridflow.entrypoints.train import run
from hybridflow.trainer.core import PPOTrainer
from tests.trainer.conftest import cut_then_resume, tiny_overrides

HALF_FLAT_REWARD = Path(__file__).parents[1] / "half_flat_reward.py"
SYNC_EQUIVALENT = (  # the synchronous run that staleness 0 must equal: bypass, a rollout copy
    "actor_rollout_ref.rollout.calculate_log_probs=true",
    "algorithm.rollout_correction.bypass_mode=true",
    "actor_rollout_ref.rollout.checkpoint_engine.backend=inproc",
)


def _rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]


def _comparable(rows: list[dict]) -> list[dict]:
    skip = ("timing_s/", "perf/", "weight_sync/", "fully_async/")
    return [{k: v for k, v in r.items() if not k.startswith(skip)} for r in rows]


def _train(tiny_task_dir, run_dir, tiny_model_dir, *extra: str) -> list[dict]:
    run(load_config(None, tiny_overrides(tiny_task_dir, run_dir, tiny_model_dir, "trainer.total_training_steps=4",
                                         *extra)))
    return _rows(run_dir)


def test_staleness_zero_trains_exactly_the_synchronous_run(tiny_task_dir, tmp_path, tiny_model_dir):
    sync = _train(tiny_task_dir, tmp_path / "sync", tiny_model_dir, *SYNC_EQUIVALENT)
    zero = _train(tiny_task_dir, tmp_path / "zero", tiny_model_dir, "async_training.mode=fully_async",
                  "async_training.staleness_threshold=0")
    # bitwise by construction: one process; the rollouter thread runs the same kernels with the
    # same intra-op thread count (torch's thread count is process-wide) on the same weights
    assert _comparable(zero) == _comparable(sync)
    assert all(r["fully_async/staleness/max"] == 0 and r["fully_async/dropped_samples"] == 0 for r in zero)


def test_one_step_off_trains_each_batch_one_version_late(tiny_task_dir, tmp_path, tiny_model_dir, monkeypatch):
    from hybridflow import fields as F
    from hybridflow.trainer.phases import PolicyUpdate

    stamps = []
    original = PolicyUpdate.run

    def record(self, batch, step, timer, metrics):
        stamps.append(sorted(set(batch.non_tensor_batch[F.WEIGHT_VERSION_MIN].tolist())))
        return original(self, batch, step, timer, metrics)

    monkeypatch.setattr(PolicyUpdate, "run", record)
    rows = _train(tiny_task_dir, tmp_path / "run", tiny_model_dir, "async_training.mode=one_step_off",
                  "trainer.test_freq=2")
    steps = [r for r in rows if "fully_async/staleness/max" in r]
    assert [r["fully_async/staleness/max"] for r in steps] == [0, 1, 1, 1]
    assert [r["weight_sync/version"] for r in steps] == [1, 2, 3, 4]
    # per response: the weights (the step they were synced at) that generated it
    assert stamps == [[0], [0], [1], [2]]
    assert all(r["fully_async/dropped_samples_total"] == 0 for r in steps)
    assert all(0 <= r["fully_async/overlap_fraction"] <= 1 for r in steps)
    assert [r["step"] for r in rows if "val-core/mean" in r] == [2, 4]


def test_fully_async_stays_within_its_bound(tiny_task_dir, tmp_path, tiny_model_dir):
    rows = _train(tiny_task_dir, tmp_path / "run", tiny_model_dir, "async_training.mode=fully_async",
                  "async_training.staleness_threshold=2", "async_training.trigger_parameter_sync_step=2",
                  "async_training.require_batches=2", "actor_rollout_ref.actor.ppo_mini_batch_size=2", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
                  "trainer.total_training_steps=6")
    steps = [r for r in rows if "fully_async/staleness/max" in r]
    assert len(steps) == 6 and all(r["fully_async/staleness/max"] <= 2 for r in steps)
    assert [r["weight_sync/version"] for r in steps if "weight_sync/version" in r] == [2, 4, 6]  # every 2 updates


def test_a_resumed_one_step_off_run_trains_no_prompt_twice(tiny_task_dir, tmp_path, tiny_model_dir, monkeypatch):
    extra = ("async_training.mode=one_step_off", "trainer.total_training_steps=4", "trainer.save_freq=2",
             "trainer.val_before_train=false")
    full = _train(tiny_task_dir, tmp_path / "full", tiny_model_dir, *extra)
    cut = cut_then_resume(lambda: _train(tiny_task_dir, tmp_path / "cut", tiny_model_dir, *extra), monkeypatch)
    assert [r["training/global_step"] for r in cut] == [1, 2, 3, 4]
    # steps 1-2 are the same run; step 3's batch is the same prompts (same uids and seed), generated again
    assert _comparable(cut)[:2] == _comparable(full)[:2]
    assert all(r["fully_async/staleness/max"] <= 1 for r in cut)


def test_fully_async_with_partial_rollout_trains_within_the_bound(tiny_task_dir, tmp_path, tiny_model_dir):
    rows = _train(tiny_task_dir, tmp_path / "run", tiny_model_dir, "async_training.mode=fully_async",
                  "async_training.partial_rollout=true", "async_training.staleness_threshold=1",
                  "actor_rollout_ref.actor.ppo_mini_batch_size=2", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
                  "async_training.require_batches=2", "data.max_response_length=48", "trainer.total_training_steps=5")
    steps = [r for r in rows if "fully_async/staleness/max" in r]
    assert len(steps) == 5 and all(r["fully_async/staleness/max"] <= 1 for r in steps)
    assert all("fully_async/aborted_requests" in r and "fully_async/partial_resumed_fraction" in r for r in steps)
    assert all(r["fully_async/dropped_samples_total"] == 0 for r in steps)


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("async_training.mode=sometimes", "unknown"),
        ("async_training.partial_rollout=true", "for mode=fully_async"),
        ("actor_rollout_ref.rollout.checkpoint_engine.backend=shared", "own weights"),
    ],
)
def test_config_errors(tiny_task_dir, tmp_path, tiny_model_dir, override, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, tiny_overrides(tiny_task_dir, tmp_path, tiny_model_dir, "async_training.mode=one_step_off",
                                         override))


def test_async_mode_defaults_to_bypass_and_a_rollout_copy(tiny_task_dir, tmp_path, tiny_model_dir):
    config = load_config(None, tiny_overrides(tiny_task_dir, tmp_path, tiny_model_dir, "async_training.mode=one_step_off"))
    assert config.algorithm.rollout_correction.bypass_mode
    assert config.actor_rollout_ref.rollout.calculate_log_probs
    assert config.actor_rollout_ref.rollout.checkpoint_engine.backend == "inproc"
    assert PPOTrainer.needs_reference(config) is False


@pytest.mark.ray
def test_one_step_off_on_ray_with_the_rollout_in_its_own_processes(ray_session, tiny_task_dir, tmp_path, tiny_model_dir):
    """trainer.backend=ray: actor (+ reference) on one pool, the rollout on a second one; each sync
    ships the actor's weights through the controller. The staleness is one version as in-process."""
    rows = _train(tiny_task_dir, tmp_path / "run", tiny_model_dir, "async_training.mode=one_step_off",
                  "trainer.backend=ray", "trainer.test_freq=2", "trainer.total_training_steps=3")
    steps = [r for r in rows if "fully_async/staleness/max" in r]
    assert [r["fully_async/staleness/max"] for r in steps] == [0, 1, 1]
    assert [r["weight_sync/version"] for r in steps] == [1, 2, 3]
    assert all(r["weight_sync/tensors"] > 0 for r in steps)  # real copies into the rollout's processes
    assert [r["step"] for r in rows if "val-core/mean" in r] == [2, 3]


@pytest.mark.ray
def test_a_one_step_off_run_on_ray_resumes(ray_session, tiny_task_dir, tmp_path, tiny_model_dir, monkeypatch):
    """Resuming on Ray ships the resumed weights to the rollout's own processes (it has no
    colocated actor to pull from) and trains the remaining steps once each."""
    extra = ("async_training.mode=one_step_off", "trainer.backend=ray", "trainer.total_training_steps=3",
             "trainer.save_freq=2", "trainer.val_before_train=false")
    rows = cut_then_resume(lambda: _train(tiny_task_dir, tmp_path / "run", tiny_model_dir, *extra), monkeypatch)
    assert [r["training/global_step"] for r in rows] == [1, 2, 3]
    assert rows[-1]["weight_sync/version"] == 3 and rows[-1]["fully_async/staleness/max"] <= 1


def _record_trained_prompts(monkeypatch) -> dict[int, list[int]]:
    """global step → the dataset indices of the prompts its update trains (one per group)."""
    from hybridflow.trainer.phases import PolicyUpdate

    trained: dict[int, list[int]] = {}
    original = PolicyUpdate.run

    def record(self, batch, step, timer, metrics):
        n = self.config.actor_rollout_ref.rollout.n
        trained[step] = [int(info["index"]) for info in batch.non_tensor_batch["extra_info"][::n]]
        return original(self, batch, step, timer, metrics)

    monkeypatch.setattr(PolicyUpdate, "run", record)
    return trained


def test_a_fully_async_run_killed_mid_step_resumes_with_every_prompt_trained_once(
    tiny_task_dir, tmp_path, tiny_model_dir, monkeypatch
):
    """32 prompts, 4 per update, 8 steps: one epoch. The rollouter runs up to two versions ahead
    in chunks of 2, the run checkpoints at step 3 and is killed inside step 5's update; the
    resume regenerates what was waiting in the buffer or in flight. Steps 1–3 of the first run
    and 4–8 of the resumed one train each prompt of the epoch exactly once."""
    from hybridflow.trainer.phases import PolicyUpdate

    trained = _record_trained_prompts(monkeypatch)
    recorded = PolicyUpdate.run

    def killed(self, batch, step, timer, metrics):
        if step == 5:
            recorded(self, batch, step, timer, metrics)  # the update starts; the process dies inside it
            raise KeyboardInterrupt("killed mid-step")
        return recorded(self, batch, step, timer, metrics)

    extra = ("async_training.mode=fully_async", "async_training.staleness_threshold=2",
             "async_training.require_batches=2", "actor_rollout_ref.actor.ppo_mini_batch_size=2",
             "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4", "trainer.total_training_steps=8",
             "trainer.save_freq=3", "trainer.test_freq=-1", "data.shuffle=false")
    monkeypatch.setattr(PolicyUpdate, "run", killed)
    with pytest.raises(KeyboardInterrupt):
        _train(tiny_task_dir, tmp_path / "run", tiny_model_dir, *extra)
    first = {step: list(prompts) for step, prompts in trained.items()}
    assert sorted(first) == [1, 2, 3, 4, 5]
    monkeypatch.setattr(PolicyUpdate, "run", recorded)
    trained.clear()
    rows = _train(tiny_task_dir, tmp_path / "run", tiny_model_dir, *extra)
    assert sorted(trained) == [4, 5, 6, 7, 8] and [r["step"] for r in rows if "step" in r][-5:] == [4, 5, 6, 7, 8]
    epoch = [p for step in (1, 2, 3) for p in first[step]] + [p for step in range(4, 9) for p in trained[step]]
    assert sorted(epoch) == list(range(32))  # every prompt once: none lost, none repeated
    assert trained[4] == first[4]  # the waiting groups were regenerated from the same prompts


def test_dapo_dynamic_sampling_runs_in_fully_async_mode(tiny_task_dir, tmp_path, tiny_model_dir, monkeypatch):
    """The group filter sits where samples enter the buffer: every trained group's responses
    differ in score, every step still trains train_batch_size groups, and the bound holds."""
    from hybridflow.trainer.phases import PolicyUpdate

    groups: list[list[float]] = []
    original = PolicyUpdate.run

    def record(self, batch, step, timer, metrics):
        n = self.config.actor_rollout_ref.rollout.n
        scores = batch.batch["token_level_scores"].sum(-1).view(-1, n)
        groups.append([float(row.max() - row.min()) for row in scores])
        return original(self, batch, step, timer, metrics)

    monkeypatch.setattr(PolicyUpdate, "run", record)
    rows = _train(tiny_task_dir, tmp_path / "run", tiny_model_dir, "async_training.mode=fully_async",
                  "async_training.staleness_threshold=1", "actor_rollout_ref.actor.ppo_mini_batch_size=2",
                  "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4", "async_training.require_batches=2",
                  "algorithm.filter_groups.enable=true", "algorithm.filter_groups.metric=score",
                  "algorithm.filter_groups.max_num_gen_batches=0", "trainer.total_training_steps=3",
                  f"custom_reward_function.path={HALF_FLAT_REWARD}")
    steps = [r for r in rows if "fully_async/staleness/max" in r]
    assert len(steps) == 3 and all(r["fully_async/staleness/max"] <= 1 for r in steps)
    assert len(groups) == 3 and all(len(g) == 4 and min(g) > 0 for g in groups)  # even-index prompts filtered out
