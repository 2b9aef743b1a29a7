"""Fixtures for end-to-end trainer runs on the tiny model and a tiny arithmetic task."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

DENSE_REWARD = Path(__file__).with_name("dense_reward.py")


def tiny_overrides(task_dir: Path, run_dir: Path, model_dir: Path, *extra: str) -> list[str]:
    """A small, fast GRPO config on the tiny model; ``extra`` overrides are appended."""
    return [
        f"data.train_files=[{task_dir / 'train.parquet'}]",
        f"data.val_files=[{task_dir / 'test.parquet'}]",
        "data.train_batch_size=4",
        "data.max_prompt_length=96",
        "data.max_response_length=8",
        f"actor_rollout_ref.model.path={model_dir}",
        "actor_rollout_ref.model.dtype=fp32",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
        "actor_rollout_ref.actor.optim.lr=1e-3",
        "actor_rollout_ref.rollout.n=2",
        "trainer.total_training_steps=2",
        "trainer.val_before_train=false",
        "trainer.logger=[jsonl]",
        f"trainer.default_local_dir={run_dir}",
        f"custom_reward_function.path={DENSE_REWARD}",
        *extra,
    ]


class CrashAt:
    """Tracking stand-in that raises when asked to log ``step`` (after the step trained): a crash
    between a supervised trainer's step and its checkpoint commit."""

    def __init__(self, inner, step: int) -> None:
        self.inner, self.step = inner, step

    def log(self, data, step: int) -> None:
        if step == self.step:
            raise RuntimeError("simulated crash")
        self.inner.log(data, step)

    def rewind(self, next_step: int) -> None:
        self.inner.rewind(next_step)

    def finish(self) -> None:
        self.inner.finish()


def cut_then_resume(
    train: Callable[[], Any],
    monkeypatch: pytest.MonkeyPatch,
    stop_at: int = 3,
    trainer_cls: type | None = None,
    method: str = "step",
) -> Any:
    """``train()`` stopped by a KeyboardInterrupt as ``trainer_cls.method`` (default
    ``PPOTrainer.step``) runs at global step ``stop_at`` (a simulated crash), then ``train()``
    again unpatched (the resume); returns its result."""
    from hybridflow.trainer.core import PPOTrainer

    cls = trainer_cls if trainer_cls is not None else PPOTrainer
    original = getattr(cls, method)

    def crash(self, *args, **kwargs):
        if self.global_steps == stop_at:
            raise KeyboardInterrupt("simulated stop")
        return original(self, *args, **kwargs)

    monkeypatch.setattr(cls, method, crash)
    with pytest.raises(KeyboardInterrupt):
        train()
    monkeypatch.setattr(cls, method, original)
    return train()
