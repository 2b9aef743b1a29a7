"""DataProtoFuture with already-materialised values (no Ray needed)."""

from __future__ import annotations

import pickle
import sys

import pytest

from hybridflow import fields as F
from hybridflow.protocol import DataProto, DataProtoFuture


def _ids(data: DataProto) -> list[int]:
    return data.batch[F.INPUT_IDS][:, 0].tolist()


def test_concat_then_get(make_proto):
    data = make_proto(4)
    future = DataProtoFuture.concat([data[:2], data[2:]])
    assert future.dispatch_fn is None
    assert _ids(future.get()) == [0, 1, 2, 3]


def test_chunk_selects_each_part(make_proto):
    data = make_proto(6)
    futures = DataProtoFuture.concat([data[:3], data[3:]]).chunk(3)
    assert [_ids(f.get()) for f in futures] == [[0, 1], [2, 3], [4, 5]]


def test_chunk_of_chunk_composes(make_proto):
    data = make_proto(8)
    halves = DataProtoFuture.concat([data]).chunk(2)
    quarters = halves[1].chunk(2)
    assert [_ids(q.get()) for q in quarters] == [[4, 5], [6, 7]]


def test_custom_collect_and_dispatch(make_proto):
    data = make_proto(4)
    future = DataProtoFuture(collect_fn=lambda parts: parts[1], futures=[data[:1], data[1:]], dispatch_fn=lambda d: d[:1])
    assert _ids(future.get()) == [1]


def test_get_passes_resolved_values_to_collect_fn():
    future = DataProtoFuture(collect_fn=lambda outputs: sum(outputs), futures=[1, 2, 3])
    assert future.get() == 6


def test_chunked_future_pickles(make_proto):
    future = DataProtoFuture.concat([make_proto(4)]).chunk(2)[1]
    assert _ids(pickle.loads(pickle.dumps(future)).get()) == [2, 3]


def test_get_does_not_import_ray(make_proto):
    had_ray = "ray" in sys.modules
    DataProtoFuture.concat([make_proto(2)]).get()
    assert ("ray" in sys.modules) == had_ray


@pytest.mark.ray
def test_get_fetches_ray_object_refs(make_proto, ray_session):
    import ray  # an optional dependency of the package, part of the test extras

    data = make_proto(4)
    refs = [ray.put(data[:2]), ray.put(data[2:])]
    futures = DataProtoFuture.concat(refs).chunk(2)
    assert [_ids(f.get()) for f in futures] == [[0, 1], [2, 3]]
    mixed = DataProtoFuture.concat([refs[0], data[2:]])  # ObjectRefs and plain values together
    assert _ids(mixed.get()) == [0, 1, 2, 3]
