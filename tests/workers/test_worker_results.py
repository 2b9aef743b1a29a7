"""The result convention of worker methods (docs/workers.md, "Results: data and metrics"),
through a 2-rank worker group on both backends: metrics come back as values, one list entry
per rank; options travel as arguments, replicated; data and metrics come back as a pair."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch

from hybridflow.controller import (
    ClassWithInitArgs,
    LocalWorkerGroup,
    ResourcePool,
    WorkerGroup,
)
from hybridflow.protocol import DataProto
from hybridflow.trainer.metrics import reduce_metrics
from hybridflow.workers.data_parallel import merge_rank_metrics
from hybridflow.workers.rollout.base import RolloutOutput
from tests.workers.result_workers import ResultsWorker

BACKENDS = ["local", pytest.param("ray", marks=pytest.mark.ray)]


@pytest.fixture(scope="module", params=BACKENDS)
def group(request: pytest.FixtureRequest) -> Iterator[WorkerGroup[ResultsWorker]]:
    spec = ClassWithInitArgs(ResultsWorker)
    if request.param == "local":
        wg: WorkerGroup[Any] = LocalWorkerGroup(ResourcePool([2]), spec)
    else:
        request.getfixturevalue("ray_session")
        from hybridflow.controller.ray_backend import RayResourcePool, RayWorkerGroup

        wg = RayWorkerGroup(RayResourcePool([2], cpus_per_process=0.5), spec)
    yield wg
    wg.shutdown()
    pool = getattr(wg, "resource_pool", None)
    if pool is not None:
        pool.remove()


def rows(n: int, auto_padding: bool = False) -> DataProto:
    return DataProto.from_dict({"x": torch.arange(n, dtype=torch.float32)}, auto_padding=auto_padding)


def test_metrics_come_back_as_one_list_per_name_in_rank_order(group) -> None:
    metrics = group.call(ResultsWorker.train, rows(6))
    assert metrics == {"rank": [0.0, 1.0], "rows": [3.0, 3.0], "sum": [3.0, 12.0]}
    assert reduce_metrics(metrics) == {"rank": 0.5, "rows": 3.0, "sum": 7.5}


def test_options_are_replicated_while_the_data_is_split(group) -> None:
    out = group.call(ResultsWorker.score, rows(4), 2.0, shift=True)
    assert out.batch["y"].tolist() == [0.0, 2.0, 104.0, 106.0]
    assert out.non_tensor_batch["who"].tolist() == [0, 0, 1, 1]
    plain = group.call(ResultsWorker.score, rows(4))  # defaults on every rank
    assert plain.batch["y"].tolist() == [0.0, 1.0, 2.0, 3.0]
    padded = group.call(ResultsWorker.score, rows(3, auto_padding=True), factor=3.0)
    assert padded.batch["y"].tolist() == [0.0, 3.0, 6.0]  # the padding row is dropped again


def test_data_and_metrics_come_back_as_a_pair(group) -> None:
    out = group.call(ResultsWorker.generate, rows(4))
    assert isinstance(out, RolloutOutput)
    data, metrics = out
    assert data.batch["y"].tolist() == [1.0, 2.0, 3.0, 4.0] and data.meta_info == {"weight_version": 7}
    assert metrics == {"rank": [0.0, 1.0], "rows": [2.0, 2.0]}
    with pytest.raises(Exception, match="does not auto-pad"):
        group.call(ResultsWorker.generate, rows(3, auto_padding=True))


def test_merge_rank_metrics_names_a_rank_that_returned_no_dict() -> None:
    assert merge_rank_metrics([{"a": 1.0}, {"a": 2.0, "b": 3.0}]) == {"a": [1.0, 2.0], "b": [3.0]}
    with pytest.raises(TypeError, match="rank 1 returned a DataProto"):
        merge_rank_metrics([{"a": 1.0}, rows(2)])
