"""``PPOTrainer.close`` shuts every worker group down even when an earlier step of it fails —
a rollout worker that died raises ``WorkerError`` from its close — and then raises that error."""

from __future__ import annotations

import pytest

from hybridflow.config import load_config
from hybridflow.controller import WorkerError
from hybridflow.entrypoints.train import build_trainer

from .conftest import tiny_overrides


def test_a_dead_rollout_worker_does_not_keep_the_groups_alive(tiny_task_dir, tiny_model_dir, tmp_path, monkeypatch):
    trainer = build_trainer(
        load_config(None, tiny_overrides(tiny_task_dir, tmp_path / "run", tiny_model_dir, "data.val_files=[]"))
    )
    shut_down: list[object] = []
    for group in trainer.workers.owners:
        original = group.shutdown
        monkeypatch.setattr(group, "shutdown", lambda g=group, f=original: (shut_down.append(g), f())[1])

    def dead_rollout() -> None:
        raise WorkerError(0, "close", "ActorDiedError: the worker process exited")

    monkeypatch.setattr(trainer.workers.rollout, "close", dead_rollout)
    assert trainer.workers.owners, "the tiny trainer owns at least one worker group"
    with pytest.raises(WorkerError, match="ActorDiedError"):
        trainer.close()
    assert shut_down == list(trainer.workers.owners)
