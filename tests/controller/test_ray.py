"""Ray backend only: separate processes, torch.distributed rendezvous, timeouts, killed workers."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator

import pytest
import ray
import torch

from hybridflow.controller import (
    ClassWithInitArgs,
    ResourcePool,
    WorkerDiedError,
    WorkerTimeoutError,
    create_worker_group,
)
from hybridflow.controller.ray_backend import RayResourcePool, RayWorkerGroup, as_ray_resource_pool, init_ray
from hybridflow.protocol import DataProto
from tests.controller.toy_workers import ToyWorker

pytestmark = pytest.mark.ray


@pytest.fixture(scope="module")
def group(ray_session: None) -> Iterator[RayWorkerGroup[ToyWorker]]:
    pool = RayResourcePool([2], cpus_per_process=0.5)  # leaves room for other groups in 2 CPUs
    wg = create_worker_group("ray", pool, ClassWithInitArgs(ToyWorker))
    assert isinstance(wg, RayWorkerGroup)
    yield wg
    wg.shutdown()
    pool.remove()


def test_pool_bundles_and_validation() -> None:
    # no Ray needed: placement groups are only reserved on first use
    assert RayResourcePool([2], use_gpu=True).bundle() == {"CPU": 1.0, "GPU": 1.0}
    pool = RayResourcePool([3, 1], cpus_per_process=0.5)
    assert pool.bundle() == {"CPU": 0.5} and pool.world_size == 4 and not pool.use_gpu
    assert pool.local_ranks() == [(0, 0, 3), (0, 1, 3), (0, 2, 3), (1, 0, 1)]
    with pytest.raises(ValueError, match="cpus_per_process must be > 0"):
        RayResourcePool([1], cpus_per_process=0)
    # a plain pool handed to RayWorkerGroup becomes a Ray pool with the same shape
    converted = as_ray_resource_pool(ResourcePool([2, 1], max_colocate_count=2, use_gpu=True))
    assert (converted.process_on_nodes, converted.max_colocate_count, converted.bundle()) == (
        [2, 1],
        2,
        {"CPU": 1.0, "GPU": 1.0},
    )


def test_ranks_are_processes_of_their_own(group: RayWorkerGroup[ToyWorker]) -> None:
    info = group.whoami()
    pids = [i["pid"] for i in info]
    assert len(set(pids)) == 2 and os.getpid() not in pids
    assert [i["env_rank"] for i in info] == ["0", "1"]  # torch.distributed variables exported
    future = group.double_later(DataProto.from_dict({"x": torch.arange(4.0)}))
    assert all(isinstance(ref, ray.ObjectRef) for ref in future.futures)  # data stays in the object store
    init_ray()  # already initialised: a no-op, not a second instance
    assert ray.is_initialized()


def test_ranks_rendezvous_for_torch_distributed(group: RayWorkerGroup[ToyWorker]) -> None:
    # gloo over the MASTER_ADDR/MASTER_PORT the group chose on rank 0's node: 1 + 2 on both ranks
    assert group.all_reduce_ranks() == [3.0, 3.0]


def test_slow_call_times_out_naming_the_rank(group: RayWorkerGroup[ToyWorker]) -> None:
    group.call_timeout_s = 0.5
    try:
        with pytest.raises(
            WorkerTimeoutError, match=r"rank 0 timed out in ToyWorker.sleep_for: no result after 0.5 s from ranks \[0\]"
        ):
            group.execute_rank_zero("sleep_for", 3.0)
    finally:
        group.call_timeout_s = None


@pytest.mark.timeout(90)
def test_killed_worker_is_reported_with_rank_and_cause(group: RayWorkerGroup[ToyWorker]) -> None:
    victim = group.host_infos()[1].pid
    killer = threading.Timer(1.0, os.kill, (victim, signal.SIGKILL))
    start = time.monotonic()
    killer.start()
    try:
        with pytest.raises(WorkerDiedError) as info:
            group.sleep_for(60.0)
    finally:
        killer.cancel()
    assert time.monotonic() - start < 30
    err = info.value
    assert err.rank == 1
    assert f"rank 1 died (worker process lost) during ToyWorker.sleep_for: pid {victim}" in str(err)
    assert "ActorDiedError" in str(err)
