"""Shared fixtures for the whole suite: offline switches, one tiny model folder, rollout rows."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

REPO_ROOT = str(Path(__file__).resolve().parents[1])

# Nothing in the tests may reach the Hugging Face hub: a missing file must fail at once.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"


def _share_cores_between_xdist_workers() -> None:
    """Under ``pytest -n N`` each worker gets its share of the cores for torch's intra-op threads
    (and so do the processes a test starts: they inherit the environment), instead of N workers
    each running one thread per core and waiting for each other's descheduled threads. Set
    before torch is imported; a thread count the caller set explicitly is kept."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0") or 0)
    if workers < 2:
        return
    share = str(max(1, (os.cpu_count() or 1) // workers))
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(name, share)


_share_cores_between_xdist_workers()

# Property tests draw the same examples on every run (the suite is deterministic): a failure found
# once is found again, on every CPU kind. Exploring new examples is a deliberate local run with
# HYPOTHESIS_PROFILE=explore.
from hypothesis import settings  # noqa: E402

settings.register_profile("deterministic", derandomize=True)
settings.register_profile("explore", derandomize=False)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "deterministic"))

TINY_EOS_ID = 2  # <|im_end|> in the tiny tokenizer
TINY_PAD_ID = 3


@pytest.fixture(scope="module")
def one_torch_thread() -> Iterator[None]:
    """One intra-op thread for a test module (``pytestmark = pytest.mark.usefixtures(...)``):
    on a shared, busy 2-core machine a parallel op waits for its descheduled second thread
    (~15 ms per op); the results are the same either way."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An HF folder (config + safetensors + tokenizer) of a 2-layer, hidden-128 tiny llama."""
    from hybridflow.models.tiny import save_tiny_model

    return save_tiny_model(tmp_path_factory.mktemp("tiny") / "tiny-llama", arch="llama", seed=0)


def _rollout_batch(num_rows: int = 8, prompt_len: int = 6, response_len: int = 5, seed: int = 0) -> Any:
    import torch

    from hybridflow import fields as FK
    from hybridflow.protocol import DataProto

    g = torch.Generator().manual_seed(seed)
    prompts = torch.full((num_rows, prompt_len), TINY_PAD_ID)
    responses = torch.full((num_rows, response_len), TINY_PAD_ID)
    attention = torch.zeros(num_rows, prompt_len + response_len, dtype=torch.long)
    for i in range(num_rows):
        p = int(torch.randint(1, prompt_len + 1, (1,), generator=g))
        r = int(torch.randint(1, response_len + 1, (1,), generator=g))
        prompts[i, prompt_len - p :] = torch.randint(4, 500, (p,), generator=g)
        responses[i, :r] = torch.randint(4, 500, (r,), generator=g)
        if r < response_len:
            responses[i, r - 1] = TINY_EOS_ID
        attention[i, prompt_len - p : prompt_len + r] = 1
    mask = attention[:, prompt_len:].float()
    positions = (attention.cumsum(dim=-1) - 1).clamp(min=0)
    tensors = {
        FK.PROMPTS: prompts,
        FK.RESPONSES: responses,
        FK.INPUT_IDS: torch.cat([prompts, responses], dim=1),
        FK.ATTENTION_MASK: attention,
        FK.POSITION_IDS: positions,
        FK.RESPONSE_MASK: mask,
        FK.ADVANTAGES: torch.randn(num_rows, response_len, generator=g) * mask,
        FK.RETURNS: torch.randn(num_rows, response_len, generator=g) * mask,
        FK.VALUES: torch.randn(num_rows, response_len, generator=g) * 0.1 * mask,
    }
    return DataProto.from_dict(tensors=tensors)


@pytest.fixture(scope="session")
def make_rollout_batch() -> Callable[..., Any]:
    """``make_rollout_batch(num_rows=8, prompt_len=6, response_len=5, seed=0)`` → a DataProto laid
    out like a rollout: prompts left-padded, responses right-padded (an EOS ends the short
    ones), position ids over real tokens, random advantages / returns / values × mask."""
    return _rollout_batch


@pytest.fixture(scope="session")
def make_config(tiny_model_dir: Path) -> Callable[..., Any]:
    """``make_config(*overrides)`` → a PPOConfig on the tiny model: fp32 (exact comparisons),
    rollout.n=2, 4 prompts per mini-batch (8 rows), one micro-batch of 8, lr 1e-3, then
    ``overrides``."""
    from hybridflow.config import load_config

    def build(*overrides: str) -> Any:
        base = [
            f"actor_rollout_ref.model.path={tiny_model_dir}",
            "actor_rollout_ref.model.dtype=fp32",
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
    from hybridflow.entrypoints.data import main as data_main

    out = tmp_path_factory.mktemp("arith")
    assert data_main(["arithmetic", "--out", str(out), "--train-size", "32", "--test-size", "8", "--digits", "1"]) == 0
    return out


@pytest.fixture(scope="session")
def ray_session() -> Iterator[None]:
    """One local Ray instance (2 CPUs, no dashboard) for the whole test session, started on
    first use by any area (controller, scale, protocol) and stopped at the end."""
    import ray

    # Ray's worker processes inherit this environment: make the repository (hybridflow and the
    # test worker modules) importable there whatever directory pytest ran from.
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


@pytest.fixture
def one_rank_group() -> Iterator[None]:
    """A one-rank gloo process group for the test (FSDP engines need one)."""
    import torch.distributed as dist

    from hybridflow.controller.worker import find_free_port

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{find_free_port()}", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()
