"""The replay buffer between the producer and the consumer phases.

Producers :meth:`~ReplayBuffer.put` scored prompt groups (all n responses of a prompt),
each tagged with the weight version that generated it; the trainer :meth:`~ReplayBuffer.take`
s exactly one update's groups, oldest first. On the way:

* **filters** (DAPO dynamic sampling's group filter, :mod:`hybridflow.trainer.filters`) run
  at admission: a group they drop never enters, and is counted;
* **staleness**: at :meth:`take`, a group more versions old than the bound is evicted and
  counted (``fully_async/count/dropped_stale_samples``, verl's name);
* **reissue**: every group remembers where its prompt sits in the loader
  (:attr:`Sample.origins`), so a checkpoint can restart generation at the first prompt
  not trained yet (:meth:`first_origin`) — nothing in flight is lost or trained twice.

Synchronous training fills it with exactly one batch and takes it; the asynchronous schedules
put from the rollouter thread. ``put`` blocks while the buffer is full (``capacity`` groups).
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hybridflow.protocol import DataProto

Origin = tuple[dict[str, Any], int]  # (the loader's state before a batch, rows of it already used)
GroupFilter = Callable[[DataProto], tuple[np.ndarray, int]]  # batch → (rows to keep, groups kept)


@dataclass
class Sample:
    """``groups`` prompt groups of ``batch`` (n rows each, interleaved), generated with weight
    ``version``. ``index``: production order; ``metrics``: generation-side metrics;
    ``gen_seconds``: how long producing it took; ``origins``: per group, where its prompt
    starts in the loader (asynchronous runs; ``None`` when the step boundary is the origin)."""

    index: int
    groups: int
    version: int
    batch: DataProto
    metrics: dict[str, float] = field(default_factory=dict)
    gen_seconds: float = 0.0
    origins: list[Origin] | None = None

    def head(self, groups: int) -> tuple[Sample, Sample]:
        """(the first ``groups`` groups, the rest); the metrics stay with the first part."""
        rows = len(self.batch) // self.groups * groups
        first = Sample(
            self.index,
            groups,
            self.version,
            self.batch.select_idxs(np.arange(rows)),
            self.metrics,
            self.gen_seconds,
            self.origins[:groups] if self.origins else None,
        )
        rest = Sample(
            self.index,
            self.groups - groups,
            self.version,
            self.batch.select_idxs(np.arange(rows, len(self.batch))),
            {},
            0.0,
            self.origins[groups:] if self.origins else None,
        )
        return first, rest


@dataclass
class Taken:
    """One update's samples, the staleness (in versions) of each, and what was evicted on the way."""

    samples: list[Sample]
    staleness: list[int]
    evicted_groups: int


class BufferFailed(RuntimeError):
    """A producer raised; the trainer re-raises its error."""


class ReplayBuffer:
    """FIFO of :class:`Sample` s, filtered at admission, evicted by staleness at :meth:`take`."""

    def __init__(self, capacity: int | None = None, group_filter: GroupFilter | None = None, admitted: int = 0) -> None:
        if capacity is not None and capacity < 1:
            raise ValueError(f"capacity must be >= 1 group, got {capacity}")
        self.capacity = capacity
        self.group_filter = group_filter
        self.admitted = admitted  # groups admitted so far: the index the next admitted group gets
        self.filtered_groups = 0  # groups a filter dropped
        self._items: deque[Sample] = deque()
        self._groups = 0
        self._cond = threading.Condition()
        self._closed = False
        self._error: BaseException | None = None

    def __len__(self) -> int:
        """Groups waiting to be taken."""
        with self._cond:
            return self._groups

    def put(self, sample: Sample) -> bool:
        """Admit a sample's groups that pass the filter (waits for room); False if closed meanwhile."""
        sample = self._filtered(sample)
        with self._cond:
            self._cond.wait_for(lambda: self._closed or self.capacity is None or self._groups < self.capacity)
            if self._closed:
                return False
            if sample.groups:
                self._items.append(sample)
                self._groups += sample.groups
                self.admitted += sample.groups
            self._cond.notify_all()
            return True

    def _filtered(self, sample: Sample) -> Sample:
        if self.group_filter is None:
            return sample
        rows, kept = self.group_filter(sample.batch)
        with self._cond:
            self.filtered_groups += sample.groups - kept
        if kept == sample.groups:
            return sample
        origins = None
        if sample.origins is not None:
            per_group = len(sample.batch) // sample.groups
            firsts = sorted({int(r) // per_group for r in rows})
            origins = [sample.origins[g] for g in firsts]
        return Sample(
            sample.index,
            kept,
            sample.version,
            sample.batch.select_idxs(rows),
            sample.metrics,
            sample.gen_seconds,
            origins,
        )

    def take(self, groups: int, version: int = 0, max_staleness: int | None = None) -> Taken:
        """The next ``groups`` groups, oldest first (waits for them), for an update that starts
        from weight ``version``; a sample more than ``max_staleness`` versions older is evicted
        and counted instead. Raises :class:`BufferFailed` after :meth:`fail`."""
        samples, staleness, evicted, need = [], [], 0, groups
        with self._cond:
            while need:
                self._cond.wait_for(lambda: self._items or self._error is not None or self._closed)
                if not self._items:
                    if self._error is not None:
                        raise BufferFailed(
                            f"the producer failed: {type(self._error).__name__}: {self._error}"
                        ) from self._error
                    raise BufferFailed("the producer stopped before the trainer had its samples")
                sample = self._items.popleft()
                self._groups -= sample.groups
                if max_staleness is not None and version - sample.version > max_staleness:
                    evicted += sample.groups
                    continue
                if sample.groups > need:
                    sample, rest = sample.head(need)
                    self._items.appendleft(rest)
                    self._groups += rest.groups
                samples.append(sample)
                staleness.append(version - sample.version)
                need -= sample.groups
            self._cond.notify_all()
        return Taken(samples, staleness, evicted)

    def first_origin(self) -> Origin | None:
        """Where the oldest waiting group's prompt starts (None: nothing waiting)."""
        with self._cond:
            for sample in self._items:
                if sample.origins:
                    return sample.origins[0]
            return None

    def clear(self) -> int:
        """Drop every waiting group; returns how many."""
        with self._cond:
            dropped, self._groups = self._groups, 0
            self._items.clear()
            self._cond.notify_all()
            return dropped

    def fail(self, error: BaseException) -> None:
        with self._cond:
            self._error = error
            self._cond.notify_all()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()


def concat_samples(samples: list[Sample]) -> DataProto:
    """One batch of the samples' rows, in order. Per-call facts that differ between samples
    (each one's sampling seed) are dropped from ``meta_info``; the ones they share stay."""
    if len(samples) == 1:
        return samples[0].batch
    metas = [s.batch.meta_info for s in samples]
    shared = {k: v for k, v in metas[0].items() if all(k in m and _same(m[k], v) for m in metas[1:])}
    parts = [
        DataProto(batch=s.batch.batch, non_tensor_batch=s.batch.non_tensor_batch, meta_info=dict(shared))
        for s in samples
    ]
    return DataProto.concat(parts)


def _same(a: Any, b: Any) -> bool:
    try:
        return bool(a == b)
    except (TypeError, ValueError):  # arrays compare element-wise
        return a is b
