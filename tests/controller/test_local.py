"""In-process backend specifics: the embedded default, mesh dispatch over 4 ranks, build errors."""

from __future__ import annotations

import os

import pytest
import torch

from hybridflow.controller import (
    ClassWithInitArgs,
    LocalWorkerGroup,
    ResourcePool,
    Worker,
    WorkerError,
    create_worker_group,
    register,
)
from hybridflow.protocol import DataProto
from tests.controller.toy_workers import ToyWorker


class BrokenWorker(Worker):
    def __init__(self, fail_rank: int) -> None:
        super().__init__()
        if self.rank == fail_rank:
            raise RuntimeError("no model here")

    @register()
    def noop(self) -> None:
        return None


def test_default_is_one_rank_in_this_process() -> None:
    wg = create_worker_group("local", ResourcePool(), ClassWithInitArgs(ToyWorker))
    assert isinstance(wg, LocalWorkerGroup) and wg.world_size == 1
    [info] = wg.whoami()
    assert info["pid"] == os.getpid() and info["rank"] == 0
    assert info["env_rank"] == os.environ.get("RANK")  # nothing exported into the shared process
    assert LocalWorkerGroup(None, ClassWithInitArgs(ToyWorker)).world_size == 1


def test_a_shut_down_group_says_so() -> None:
    with LocalWorkerGroup(ResourcePool([2]), ClassWithInitArgs(ToyWorker)) as wg:
        assert wg.add_rank(1.0) == [1.0, 11.0]
    with pytest.raises(RuntimeError, match="cannot call ToyWorker.add_rank: the worker group was shut down"):
        wg.add_rank(1.0)


def test_unknown_backend_lists_the_valid_ones() -> None:
    with pytest.raises(ValueError, match="unknown worker-group backend 'mpi'; valid names: local, ray"):
        create_worker_group("mpi", ResourcePool(), ClassWithInitArgs(ToyWorker))


def test_mesh_dispatch_with_tensor_parallel_peers() -> None:
    wg = LocalWorkerGroup(ResourcePool([4]), ClassWithInitArgs(ToyWorker, tp_size=2))
    data = DataProto.from_dict({"x": torch.arange(6, dtype=torch.float32)})
    # dp ranks: 0,0,1,1; ranks 0 and 2 collect → rows 0-2 from rank 0, rows 3-5 (+2000) from rank 2
    assert wg.mesh_add(data).batch["y"].tolist() == [0.0, 1.0, 2.0, 2003.0, 2004.0, 2005.0]


def test_local_ranks_over_two_nodes() -> None:
    wg = LocalWorkerGroup(ResourcePool([2, 1]), ClassWithInitArgs(ToyWorker))
    assert [(i["rank"], i["local_rank"]) for i in wg.whoami()] == [(0, 0), (1, 1), (2, 0)]


def test_a_failing_constructor_names_the_rank() -> None:
    with pytest.raises(WorkerError, match="rank 1 failed in BrokenWorker.__init__: RuntimeError: no model here"):
        LocalWorkerGroup(ResourcePool([2]), ClassWithInitArgs(BrokenWorker, fail_rank=1))


def test_resource_pool_validates_its_input() -> None:
    with pytest.raises(ValueError, match="positive counts"):
        ResourcePool([2, 0])
    assert ResourcePool([2, 3]).world_size == 5
    with pytest.raises(TypeError, match="needs a class"):
        ClassWithInitArgs(ToyWorker())  # type: ignore[arg-type]


def test_colocation_specs_are_checked_early() -> None:
    from hybridflow.controller import colocated_class, colocated_role_classes

    with pytest.raises(ValueError, match="non-empty"):
        colocated_class({})
    with pytest.raises(TypeError, match="role 'x': int is not a Worker subclass"):
        colocated_class({"x": ClassWithInitArgs(int)})
    spec = colocated_class({"toy": ClassWithInitArgs(ToyWorker)})
    with pytest.raises(TypeError, match="cannot be nested"):
        colocated_class({"inner": spec})
    assert colocated_role_classes(spec) == {"toy": ToyWorker}
    with pytest.raises(TypeError, match="is not a ColocatedWorker"):
        colocated_role_classes(ClassWithInitArgs(ToyWorker))
