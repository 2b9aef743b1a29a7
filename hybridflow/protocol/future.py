"""``DataProtoFuture``: a DataProto that a non-blocking worker-group call will produce."""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from hybridflow.protocol.dataproto import DataProto
from hybridflow.protocol.rows import check_positive_int


@dataclass(frozen=True)
class _TakeChunk:
    """``x → inner(x).chunk(chunks)[index]``; a class (not a closure) so futures pickle."""

    index: int
    chunks: int
    inner: Callable[[Any], Any] | None = None

    def __call__(self, data: DataProto) -> DataProto:
        if self.inner is not None:
            data = self.inner(data)
        return data.chunk(chunks=self.chunks)[self.index]


@dataclass
class DataProtoFuture:
    """A DataProto not computed yet: ``collect_fn(resolved futures)``, then ``dispatch_fn``.

    Lets a non-blocking worker-group call return at once and be handed to another call;
    ``get()`` resolves it. In the Ray backend the futures are ``ray.ObjectRef``s; any other
    value is taken as already materialised.
    """

    collect_fn: Callable[[list[Any]], DataProto]
    futures: list[Any]
    dispatch_fn: Callable[[DataProto], DataProto] | None = None

    @staticmethod
    def concat(data: list[Any]) -> DataProtoFuture:
        """A future of ``DataProto.concat`` over the results of ``data``."""
        return DataProtoFuture(collect_fn=DataProto.concat, futures=list(data))

    def chunk(self, chunks: int) -> list[DataProtoFuture]:
        """``chunks`` futures, the i-th resolving to chunk i of this future's value."""
        check_positive_int("chunks", chunks)
        return [
            DataProtoFuture(
                collect_fn=self.collect_fn, futures=self.futures, dispatch_fn=_TakeChunk(i, chunks, self.dispatch_fn)
            )
            for i in range(chunks)
        ]

    def get(self) -> DataProto:
        """``dispatch_fn(collect_fn(resolved futures))``.

        The resolved values go to ``collect_fn`` as they are (it checks their types: a
        non-blocking metric or rank-zero call may collect something other than DataProtos).
        """
        result = self.collect_fn(_resolve(self.futures))
        if self.dispatch_fn is not None:
            result = self.dispatch_fn(result)
        return result


def _resolve(futures: list[Any]) -> list[Any]:
    """Fetch Ray ObjectRefs with one ``ray.get``; other values pass through unchanged."""
    # An ObjectRef cannot exist unless ray is already imported, so without ray in
    # sys.modules there is nothing to fetch and the optional dependency stays unloaded.
    if "ray" not in sys.modules:
        return list(futures)
    import ray

    positions = [i for i, f in enumerate(futures) if isinstance(f, ray.ObjectRef)]
    resolved = list(futures)
    if not positions:  # ray.get([]) would start a Ray instance as a side effect
        return resolved
    for i, value in zip(positions, ray.get([futures[i] for i in positions])):
        resolved[i] = value
    return resolved
