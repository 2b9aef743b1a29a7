"""The rollouter: a thread that generates and scores prompt chunks ahead of the trainer.

It takes prompts from the training loader in chunks, waits until the weight version the plan
requires for the next chunk is served (the staleness bound, counted in groups the replay
buffer admitted), generates and scores the chunk holding the gate's generation lock (so a
weight sync never lands in the middle of a chunk), and puts it into the replay buffer. Its busy
intervals are kept for the overlap metric. Any exception is handed to the trainer through the
buffer.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from hybridflow.protocol import DataProto
from hybridflow.trainer.buffer import Origin, ReplayBuffer, Sample
from hybridflow.trainer.schedules.plan import AsyncPlan, VersionGate


class PromptChunks:
    """The training prompts in chunks of ``size`` rows, across epochs, remembering where each
    chunk starts in the loader (:meth:`origin`) so a checkpoint can resume at a chunk."""

    def __init__(self, loader: Any, size: int, start: Origin | None = None) -> None:
        self.loader = loader
        self.size = size
        self._iter: Iterator[dict[str, Any]] | None = None
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

    def _next_batch(self) -> DataProto:
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
        return self._batch

    def next(self) -> tuple[DataProto, list[Origin]]:
        """The next chunk's prompts and, per prompt, where it sits in the loader."""
        rows: list[DataProto] = []
        origins: list[Origin] = []
        need = self.size
        while need:
            batch = self._batch
            if batch is None or self._offset >= len(batch):
                batch = self._next_batch()
            take = min(need, len(batch) - self._offset)
            rows.append(batch.select_idxs(np.arange(self._offset, self._offset + take)))
            origins += [(self._state, self._offset + k) for k in range(take)]
            self._offset += take
            need -= take
        return (rows[0] if len(rows) == 1 else DataProto.concat(rows)), origins


Produce = Callable[[int, DataProto, int], Sample]  # (chunk index, prompts, version) → scored sample
GiveUp = Callable[[int, int], BaseException | None]  # (chunks, groups admitted) for the current update → error


class Rollouter(threading.Thread):
    """Generates chunk after chunk from ``start_chunk`` on; see the module docstring."""

    def __init__(
        self,
        produce: Produce,
        prompts: PromptChunks,
        plan: AsyncPlan,
        gate: VersionGate,
        buffer: ReplayBuffer,
        start_chunk: int = 0,
        clock: Callable[[], float] = time.perf_counter,
        hold_lock_while_generating: bool = True,
        give_up: GiveUp | None = None,
    ) -> None:
        super().__init__(name="hybridflow-rollouter", daemon=True)
        self.produce = produce
        self.prompts = prompts
        self.plan = plan
        self.gate = gate
        self.buffer = buffer
        self.next_chunk = start_chunk
        self.clock = clock
        # True: a sync waits for the chunk in flight (drain). False (partial rollout): the lock
        # covers only a chunk's start, and a sync aborts, swaps and resumes the chunk in flight.
        self.hold_lock_while_generating = hold_lock_while_generating
        self.give_up = give_up  # DAPO dynamic sampling: too many chunks for too few varied groups
        self.in_flight: list[Origin] | None = None  # the prompts of the chunk taken but not yet in the buffer
        self.busy: list[tuple[float, float]] = []

    def reissue_origin(self) -> Origin:
        """Where generation must restart so that no prompt not yet trained is lost: the oldest
        group waiting in the buffer, else the chunk in flight, else the next prompt. Call with
        the generation lock held."""
        waiting = self.buffer.first_origin()
        if waiting is not None:
            return waiting
        if self.in_flight:
            return self.in_flight[0]
        return self.prompts.origin()

    def run(self) -> None:
        try:
            update_start = self.buffer.admitted - self.buffer.admitted % self.plan.update_prompts
            chunks = 0
            while True:
                chunk = self.next_chunk
                if not self.gate.wait_for(self.plan.version_needed(self.buffer.admitted)):
                    return
                with self.gate.generation:
                    if self.gate.stopped:
                        return
                    prompts, self.in_flight = self.prompts.next()
                    version = self.gate.version
                    self.next_chunk = chunk + 1
                    if self.hold_lock_while_generating:
                        item = self._produce(chunk, prompts, version)
                if not self.hold_lock_while_generating:
                    item = self._produce(chunk, prompts, version)
                item.origins = self.in_flight
                if not self.buffer.put(item):
                    return
                self.in_flight = None
                chunks += 1
                while self.buffer.admitted >= update_start + self.plan.update_prompts:
                    update_start += self.plan.update_prompts
                    chunks = 0
                error = self.give_up(chunks, self.buffer.admitted - update_start) if self.give_up else None
                if error is not None:
                    raise error
        except BaseException as err:  # noqa: BLE001 - handed to the trainer, which re-raises it
            self.buffer.fail(err)

    def _produce(self, chunk: int, prompts: DataProto, version: int) -> Sample:
        start = self.clock()
        item = self.produce(chunk, prompts, version)
        self.busy.append((start, self.clock()))
        return item
