"""The rollouter: a thread that generates and scores prompt chunks ahead of the trainer.

It takes prompts from the training loader in chunks, waits until the weight version the
schedule requires for each chunk is served (the staleness bound), generates and scores the
chunk holding the gate's generation lock (so a weight sync never lands in the middle of a
chunk), and puts it on the bounded queue. Its busy intervals are kept for the overlap metric.
Any exception is handed to the trainer through the queue.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from hybridflow.protocol import DataProto
from hybridflow.trainer.asynchronous.queue import SampleQueue, ScoredChunk
from hybridflow.trainer.asynchronous.schedule import AsyncSchedule, VersionGate

Origin = tuple[dict[str, Any], int]  # (the loader's state before a batch, rows of it already used)


class PromptChunks:
    """The training prompts in chunks of ``size`` rows, across epochs, remembering where each
    chunk starts in the loader (:meth:`origin`) so a checkpoint can resume at a chunk."""

    def __init__(self, loader: Any, size: int, start: Origin | None = None) -> None:
        self.loader = loader
        self.size = size
        self._iter = None
        self._batch: DataProto | None = None
        self._state: dict[str, Any] = {}
        self._offset = 0
        if start is not None:
            loader.load_state_dict(start[0])
            self._skip = start[1]
        else:
            self._skip = 0

    def origin(self) -> Origin:
        """Where the next chunk starts."""
        if self._batch is not None and self._offset < len(self._batch):
            return self._state, self._offset
        return self.loader.state_dict(), self._skip

    def _next_batch(self) -> None:
        if self._iter is None:
            self._iter = iter(self.loader)
        self._state = self.loader.state_dict()
        try:
            raw = next(self._iter)
        except StopIteration:  # a new epoch
            self._iter = iter(self.loader)
            self._state = self.loader.state_dict()
            raw = next(self._iter)
        self._batch = DataProto.from_single_dict(raw)
        self._offset, self._skip = self._skip, 0

    def next(self) -> DataProto:
        rows: list[DataProto] = []
        need = self.size
        while need:
            if self._batch is None or self._offset >= len(self._batch):
                self._next_batch()
            take = min(need, len(self._batch) - self._offset)
            rows.append(self._batch.select_idxs(np.arange(self._offset, self._offset + take)))
            self._offset += take
            need -= take
        return rows[0] if len(rows) == 1 else DataProto.concat(rows)


Produce = Callable[[int, DataProto, int], ScoredChunk]  # (chunk index, prompts, version) → scored chunk


class Rollouter(threading.Thread):
    """Generates chunk after chunk from ``start_chunk`` on; see the module docstring."""

    def __init__(
        self,
        produce: Produce,
        prompts: PromptChunks,
        schedule: AsyncSchedule,
        gate: VersionGate,
        queue: SampleQueue,
        start_chunk: int = 0,
        clock: Callable[[], float] = time.perf_counter,
        hold_lock_while_generating: bool = True,
    ) -> None:
        super().__init__(name="hybridflow-rollouter", daemon=True)
        self.produce = produce
        self.prompts = prompts
        self.schedule = schedule
        self.gate = gate
        self.queue = queue
        self.next_chunk = start_chunk
        self.clock = clock
        # True: a sync waits for the chunk in flight (drain). False (partial rollout): the lock
        # covers only a chunk's start, and a sync aborts, swaps and resumes the chunk in flight.
        self.hold_lock_while_generating = hold_lock_while_generating
        self.origins: dict[int, Origin] = {}  # chunk index → where its prompts start (untrained chunks)
        self.busy: list[tuple[float, float]] = []

    def origin_of(self, chunk: int) -> Origin:
        """Where chunk ``chunk``'s prompts start; call with the generation lock held."""
        return self.origins[chunk] if chunk in self.origins else self.prompts.origin()

    def forget(self, chunk: int) -> None:
        self.origins.pop(chunk, None)

    def run(self) -> None:
        try:
            while True:
                chunk = self.next_chunk
                if not self.gate.wait_for(self.schedule.version_needed(chunk)):
                    return
                with self.gate.generation:
                    if self.gate.stopped:
                        return
                    self.origins[chunk] = self.prompts.origin()
                    prompts, version = self.prompts.next(), self.gate.version
                    self.next_chunk = chunk + 1
                    if self.hold_lock_while_generating:
                        item = self._produce(chunk, prompts, version)
                if not self.hold_lock_while_generating:
                    item = self._produce(chunk, prompts, version)
                if not self.queue.put(item):
                    return
        except BaseException as err:  # noqa: BLE001 - handed to the trainer, which re-raises it
            self.queue.fail(err)

    def _produce(self, chunk: int, prompts: DataProto, version: int) -> ScoredChunk:
        start = self.clock()
        item = self.produce(chunk, prompts, version)
        self.busy.append((start, self.clock()))
        return item
