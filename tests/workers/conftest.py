"""Fixtures for worker tests: PPO configs on the tiny model folder."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from hybridflow.config import PPOConfig, load_config


@pytest.fixture
def make_config(tiny_model_dir) -> Callable[..., PPOConfig]:
    """``make_config("actor_rollout_ref.actor.ppo_epochs=2", ...)``: rollout.n=2, 4 prompts per
    mini-batch (8 rows), one micro-batch of 8 unless overridden, lr 1e-3."""

    def build(*overrides: str) -> PPOConfig:
        base = [
            f"actor_rollout_ref.model.path={tiny_model_dir}",
            "actor_rollout_ref.rollout.n=2",
            "actor_rollout_ref.actor.ppo_mini_batch_size=4",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
            "actor_rollout_ref.actor.optim.lr=1e-3",
        ]
        return load_config(None, base + list(overrides))

    return build
