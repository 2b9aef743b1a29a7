"""Long runs stay flat: a closed trainer's model, optimizer and scorer processes are released.

Builds, trains one step and closes a trainer several times in one process; after each close
(and a garbage collection, with the trainer object itself still referenced) weak references to
every run's policy module, engine and optimizer must be dead, the run's shared-policy entry
gone, the projections' step counting back where it was, and the scorer processes stopped.
"""

from __future__ import annotations

import gc
import weakref
from pathlib import Path

import pytest
import torch

from hybridflow.config import load_config
from hybridflow.entrypoints.train import build_trainer
from hybridflow.inference import projections
from hybridflow.inference.projections import (
    Projection,
    optimizer_step_watch,
    packing_available,
)
from hybridflow.workers.shared_policy import (
    DEFAULT_SHARE_NAME,
    SharedPolicy,
    lookup_policy,
    publish_policy,
    published_policies,
)

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # a busy 2-core machine: see tests/conftest.py

DENSE_REWARD = Path(__file__).parents[1] / "trainer" / "dense_reward.py"


def _overrides(task_dir: Path, run_dir: Path, model_dir: Path) -> list[str]:
    """One GRPO step on the tiny model (rollout, reward, update), no validation."""
    return [
        f"data.train_files=[{task_dir / 'train.parquet'}]",
        "data.val_files=[]",
        "data.train_batch_size=4",
        "data.max_prompt_length=96",
        "data.max_response_length=4",
        f"actor_rollout_ref.model.path={model_dir}",
        "actor_rollout_ref.model.dtype=fp32",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
        "actor_rollout_ref.rollout.n=2",
        "trainer.total_training_steps=1",
        "trainer.val_before_train=false",
        "trainer.logger=[jsonl]",
        f"trainer.default_local_dir={run_dir}",
        f"custom_reward_function.path={DENSE_REWARD}",
    ]


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


def test_closed_trainers_release_model_and_optimizer(tiny_task_dir, tiny_model_dir, tmp_path):
    gc.collect()  # garbage of earlier tests must not be freed mid-test and skew the counts
    watch_before = optimizer_step_watch()
    seen: list[tuple[weakref.ref, ...]] = []
    for i in range(3):
        config = load_config(None, _overrides(tiny_task_dir, tmp_path / f"run{i}", tiny_model_dir))
        trainer = build_trainer(config)
        trainer.fit()
        shared = lookup_policy(DEFAULT_SHARE_NAME, 0)
        refs = (weakref.ref(shared.module), weakref.ref(shared.engine), weakref.ref(shared.engine.optimizer))
        if packing_available(torch.device("cpu"), torch.float32):  # the rollout samples from packed copies
            watchers, counted = optimizer_step_watch()
            assert watchers > watch_before[0] and counted > watch_before[1]
        scorer_pids = trainer.producer.reward_fn.scorer_pids()
        assert scorer_pids
        del shared
        if i == 2:  # a logger failing to flush still lets close() release the run
            def broken_finish():
                raise OSError("disk full")

            trainer.tracking.finish = broken_finish
            with pytest.raises(OSError, match="disk full"):
                trainer.close()
        else:
            trainer.close()
        gc.collect()  # the trainer object itself is still referenced: close() alone must release
        seen.append(refs)
        assert all(ref() is None for run in seen for ref in run), f"run {i}: model/engine/optimizer still alive"
        assert (DEFAULT_SHARE_NAME, 0) not in published_policies()
        assert optimizer_step_watch() == watch_before
        assert not any(_alive(pid) for pid in scorer_pids)


def test_shared_policy_entry_ends_with_its_module():
    from hybridflow.models.tiny import build_tiny_tokenizer

    module = torch.nn.Linear(2, 2)
    tokenizer = build_tiny_tokenizer()
    engine = type("Engine", (), {})()
    publish_policy("lifetime-test", 0, SharedPolicy(module, tokenizer, engine, False, torch.device("cpu")))
    assert lookup_policy("lifetime-test", 0).module is module
    del module
    gc.collect()
    assert ("lifetime-test", 0) not in published_policies()
    with pytest.raises(LookupError, match=r"no actor policy shared as 'lifetime-test' .*only while its actor"):
        lookup_policy("lifetime-test", 0)


def test_step_counts_and_hook_live_with_their_owners():
    gc.collect()
    watchers, counted = optimizer_step_watch()
    linear = torch.nn.Linear(4, 4)
    projection = Projection([linear], "packed")
    assert optimizer_step_watch() == (watchers + 1, counted)
    optimizer = torch.optim.SGD(linear.parameters(), lr=0.1)
    linear(torch.ones(1, 4)).sum().backward()
    optimizer.step()
    assert optimizer_step_watch() == (watchers + 1, counted + 2)  # weight and bias counted
    del linear, optimizer
    gc.collect()
    assert optimizer_step_watch() == (watchers + 1, counted + 2)  # the projection keeps its linear
    projection.linears = ()  # the last reference to the linear and its parameters
    gc.collect()
    assert optimizer_step_watch() == (watchers + 1, counted)  # counts went with the parameters
    del projection
    gc.collect()
    assert optimizer_step_watch() == (watchers, counted)
    if watchers == 0:
        assert projections._HOOK_HANDLE is None  # the process-wide hook went with the last watcher
