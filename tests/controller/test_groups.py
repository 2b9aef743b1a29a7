"""The same tests against both backends: in-process and Ray (2 ranks each)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import torch

from hybridflow.controller import (
    ClassWithInitArgs,
    LocalWorkerGroup,
    ResourcePool,
    WorkerError,
    WorkerGroup,
    colocated_class,
    registered_methods,
)
from hybridflow.protocol import DataProto, DataProtoFuture
from tests.controller.toy_workers import CounterWorker, ToyWorker

BACKENDS = ["local", pytest.param("ray", marks=pytest.mark.ray)]


def make_group(request: pytest.FixtureRequest, spec: ClassWithInitArgs[Any]) -> WorkerGroup[Any]:
    if request.param == "local":
        return LocalWorkerGroup(ResourcePool([2]), spec)
    request.getfixturevalue("ray_session")
    from hybridflow.controller.ray_backend import RayResourcePool, RayWorkerGroup

    # half a CPU per rank: two 2-rank groups fit in the 2-CPU test instance at once
    return RayWorkerGroup(RayResourcePool([2], cpus_per_process=0.5), spec)


def shut(wg: WorkerGroup[Any]) -> None:
    wg.shutdown()
    pool = getattr(wg, "resource_pool", None)
    if pool is not None:
        pool.remove()


@pytest.fixture(scope="module", params=BACKENDS)
def toy(request: pytest.FixtureRequest) -> Iterator[WorkerGroup[ToyWorker]]:
    wg = make_group(request, ClassWithInitArgs(ToyWorker, offset=0.5))
    yield wg
    shut(wg)


@pytest.fixture(scope="module", params=BACKENDS)
def colocated(request: pytest.FixtureRequest) -> Iterator[WorkerGroup[object]]:
    spec = colocated_class({"toy": ClassWithInitArgs(ToyWorker), "counter": ClassWithInitArgs(CounterWorker, start=5)})
    wg = make_group(request, spec)
    yield wg
    shut(wg)


def rows(n: int, auto_padding: bool = False) -> DataProto:
    return DataProto.from_dict({"x": torch.arange(n, dtype=torch.float32)}, auto_padding=auto_padding)


def test_ranks_know_their_place(toy: WorkerGroup[ToyWorker]) -> None:
    info = toy.whoami()
    assert [(i["rank"], i["world_size"], i["local_rank"]) for i in info] == [(0, 2, 0), (1, 2, 1)]
    assert info[0]["master"] == info[1]["master"] and not info[0]["master"].endswith(":0")
    assert toy.world_size == 2


def test_methods_table_lists_the_registered_methods(toy: WorkerGroup[ToyWorker]) -> None:
    assert toy.methods == registered_methods(ToyWorker)
    assert "add_rank_proto" in toy.methods and "set_dispatch_info" not in toy.methods
    with pytest.raises(AttributeError, match="ToyWorker has no @register method 'nope'; registered: \\[.*'add_rank'"):
        toy.nope  # noqa: B018


def test_one_to_all_and_typed_call_agree(toy: WorkerGroup[ToyWorker]) -> None:
    assert toy.add_rank(1.0) == [1.5, 11.5]
    assert toy.call(ToyWorker.add_rank, 1.0) == [1.5, 11.5]
    with pytest.raises(TypeError, match="is not a method of ToyWorker"):
        toy.call(CounterWorker.bump, 1)  # type: ignore[arg-type]


def test_all_to_all_rank_zero_and_dp_compute(toy: WorkerGroup[ToyWorker]) -> None:
    assert toy.echo(["a", "b"]) == [(0, "a"), (1, "b")]
    assert toy.echo("same") == [(0, "same"), (1, "same")]
    assert toy.rank_zero_only() == 1000
    assert toy.executed_on_rank_zero() == [0]
    assert toy.scale([2.0, 3.0]) == [2.0, 6.0]
    assert toy.execute_all("add_rank", 0.0) == [0.5, 10.5]
    assert toy.execute_rank_zero("add_rank", 0.0) == 0.5


def test_dp_compute_proto_splits_and_concatenates(toy: WorkerGroup[ToyWorker]) -> None:
    out = toy.add_rank_proto(rows(6))
    assert out.batch["y"].tolist() == [0.0, 1.0, 2.0, 103.0, 104.0, 105.0]
    assert out.non_tensor_batch["who"].tolist() == [0, 0, 0, 1, 1, 1]
    padded = toy.add_rank_proto(rows(5, auto_padding=True))
    assert padded.batch["y"].tolist() == [0.0, 1.0, 2.0, 103.0, 104.0]


def test_with_func_metric_and_mesh_modes(toy: WorkerGroup[ToyWorker]) -> None:
    assert toy.apply(torch.neg, rows(4)).batch["y"].tolist() == [-0.0, -1.0, -2.0, -3.0]
    assert toy.metrics(rows(4)) == [{"rank": 0, "rows": 2, "sum": 1.0}, {"rank": 1, "rows": 2, "sum": 5.0}]
    assert toy.mesh_add(rows(4)).batch["y"].tolist() == [0.0, 1.0, 1002.0, 1003.0]


def test_non_blocking_calls_chain_through_futures(toy: WorkerGroup[ToyWorker]) -> None:
    future = toy.double_later(rows(4))
    assert isinstance(future, DataProtoFuture)
    out = toy.add_rank_proto(future)  # each rank resolves its own chunk of the future
    assert out.batch["y"].tolist() == [0.0, 2.0, 104.0, 106.0]
    assert future.get().batch["x"].tolist() == [0.0, 2.0, 4.0, 6.0]


def test_a_raising_worker_names_its_rank_and_the_error(toy: WorkerGroup[ToyWorker]) -> None:
    with pytest.raises(WorkerError) as info:
        toy.fail_on(1)
    err = info.value
    assert err.rank == 1 and err.method == "ToyWorker.fail_on"
    assert "rank 1 failed in ToyWorker.fail_on: ValueError: boom on rank 1" in str(err)
    assert "toy_workers.py" in err.remote_traceback and "in fail_on" in err.remote_traceback
    assert "\x1b" not in err.remote_traceback  # no terminal colour codes
    assert isinstance(err.cause, ValueError)
    assert toy.add_rank(0.0) == [0.5, 10.5]  # the group is still usable


def test_colocated_roles_share_a_process_and_see_only_their_methods(colocated: WorkerGroup[object]) -> None:
    groups = colocated.spawn()
    assert sorted(groups) == ["counter", "toy"]
    toy_g, counter_g = groups["toy"], groups["counter"]
    assert toy_g.methods == registered_methods(ToyWorker)
    assert sorted(counter_g.methods) == ["bump", "pid"]
    with pytest.raises(AttributeError, match="CounterWorker has no @register method 'add_rank'"):
        counter_g.add_rank  # noqa: B018
    assert counter_g.pid() == [i["pid"] for i in toy_g.whoami()]  # same process per rank
    assert counter_g.bump(1) == [6, 7]
    assert counter_g.bump(1) == [7, 9]  # state lives in the rank processes
    assert toy_g.add_rank(0.0) == [0.0, 10.0]
    typed = colocated.role_group("counter", CounterWorker)
    assert typed.call(CounterWorker.bump, 0) == [7, 10]
    with pytest.raises(TypeError, match="role 'counter' runs CounterWorker, not ToyWorker"):
        colocated.role_group("counter", ToyWorker)


def test_spawn_needs_a_colocated_group(toy: WorkerGroup[ToyWorker]) -> None:
    with pytest.raises(TypeError, match="spawn\\(\\) needs a group built from colocated_class"):
        toy.spawn()


def test_who_holds_the_ranks(toy: WorkerGroup[ToyWorker]) -> None:
    infos = toy.host_infos()
    assert [h.pid for h in infos] == [i["pid"] for i in toy.whoami()]
    assert len(infos) == 2 and all(np.isfinite(h.pid) for h in infos)
