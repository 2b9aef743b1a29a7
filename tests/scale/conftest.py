"""Fixtures for the scale-out tests: the session's one local Ray instance, shared with other areas."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

REPO_ROOT = str(Path(__file__).resolve().parents[2])


@pytest.fixture(scope="session")
def ray_session() -> Iterator[None]:
    """A local Ray instance (2 CPUs, no dashboard) for the whole pytest session.

    The same contract as ``tests/controller/conftest.py``: whichever area's fixture runs first
    starts Ray, the others find it initialised and share it, so one pytest process never holds
    two instances. Ray's worker processes inherit PYTHONPATH, which must name the repository
    so they can import ``tests.scale.fsdp_workers``.
    """
    import ray

    if ray.is_initialized():
        yield
        return
    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = REPO_ROOT if not old else REPO_ROOT + os.pathsep + old
    try:
        ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    finally:
        if old is None:
            del os.environ["PYTHONPATH"]
        else:
            os.environ["PYTHONPATH"] = old
    yield
    ray.shutdown()


@pytest.fixture(scope="session")
def make_config(tiny_model_dir: Path) -> Callable[..., Any]:
    """``make_config(*overrides)`` → a PPOConfig on the tiny model: rollout.n=2, 4 prompts per
    mini-batch, lr 1e-3, then ``overrides``."""
    from hybridflow.config import load_config

    def build(*overrides: str) -> Any:
        base = [
            f"actor_rollout_ref.model.path={tiny_model_dir}",
            "actor_rollout_ref.rollout.n=2",
            "actor_rollout_ref.actor.ppo_mini_batch_size=4",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
            "actor_rollout_ref.actor.optim.lr=1e-3",
        ]
        return load_config(None, base + list(overrides))

    return build


@pytest.fixture(scope="session")
def tiny_task_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The built-in arithmetic task (32 train / 8 test rows, 1-digit numbers) as parquet files."""
    from hybridflow.data.__main__ import main as data_main

    out = tmp_path_factory.mktemp("arith")
    assert data_main(["arithmetic", "--out", str(out), "--train-size", "32", "--test-size", "8", "--digits", "1"]) == 0
    return out
