"""Training through each checkpoint-engine backend: a rollout that keeps its own copy of the
policy (inproc, disk) trains exactly as one that shares the actor's module (fp32), resumes
exactly, and logs the sync's metrics."""

from __future__ import annotations

import json
from pathlib import Path

from hybridflow.config import load_config
from hybridflow.entrypoints.train import run

from .conftest import cut_then_resume, tiny_overrides

COMMON = ("trainer.total_training_steps=3", "actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes=1")


def _rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]


def _comparable(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if not k.startswith(("timing_s/", "perf/", "weight_sync/"))} for r in rows]


def _train(tiny_task_dir, run_dir, tiny_model_dir, backend: str, *extra: str) -> list[dict]:
    run(load_config(None, tiny_overrides(tiny_task_dir, run_dir, tiny_model_dir, *COMMON, *extra,
                                         f"actor_rollout_ref.rollout.checkpoint_engine.backend={backend}")))
    return _rows(run_dir)


def test_copying_backends_train_exactly_like_the_shared_module(tiny_task_dir, tmp_path, tiny_model_dir):
    shared = _train(tiny_task_dir, tmp_path / "shared", tiny_model_dir, "shared")
    inproc = _train(tiny_task_dir, tmp_path / "inproc", tiny_model_dir, "inproc")
    disk = _train(tiny_task_dir, tmp_path / "disk", tiny_model_dir, "disk",
                  f"actor_rollout_ref.rollout.checkpoint_engine.engine_kwargs={{dir: {tmp_path / 'w'}}}")
    assert _comparable(inproc) == _comparable(shared) == _comparable(disk)
    assert all(r["weight_sync/tensors"] == 0 == r["weight_sync/megabytes"] for r in shared)  # nothing moves
    for rows in (shared, inproc, disk):
        assert [r["weight_sync/version"] for r in rows] == [1, 2, 3]  # the global step, stamped
    for rows in (inproc, disk):
        assert all(r["weight_sync/tensors"] > 0 and r["weight_sync/buckets"] >= 1 for r in rows)


def test_an_inproc_run_resumes_exactly(tiny_task_dir, tmp_path, tiny_model_dir, monkeypatch):
    extra = ("trainer.total_training_steps=4", "trainer.save_freq=2")
    full = _train(tiny_task_dir, tmp_path / "full", tiny_model_dir, "inproc", *extra)
    cut = cut_then_resume(lambda: _train(tiny_task_dir, tmp_path / "cut", tiny_model_dir, "inproc", *extra), monkeypatch)
    assert _comparable(cut) == _comparable(full)
