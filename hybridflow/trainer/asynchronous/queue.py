"""The bounded queue of scored chunks from the rollouter to the trainer."""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass, field

from hybridflow.protocol import DataProto


@dataclass
class ScoredChunk:
    """``prompts`` prompt groups (all their responses), generated and scored.

    ``index`` is the chunk's place in generation order; ``version`` the weight version (syncs)
    that generated every token of it (a sync waits for the chunk in flight, so there is one);
    ``metrics`` the generation-side metrics (rewards' counters, agent-loop statistics);
    ``gen_seconds`` how long generating and scoring took.
    """

    index: int
    prompts: int
    version: int
    batch: DataProto
    metrics: dict[str, float] = field(default_factory=dict)
    gen_seconds: float = 0.0


class RolloutFailed(RuntimeError):
    """The rollouter thread raised; the trainer re-raises its error."""


class SampleQueue:
    """FIFO of :class:`ScoredChunk` s, at most ``capacity`` of them: :meth:`put` blocks while
    full. An error put with :meth:`fail` is raised to the taker; :meth:`close` wakes everyone."""

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self._items: deque[ScoredChunk] = deque()
        self._cond = threading.Condition()
        self._closed = False
        self._error: BaseException | None = None

    def __len__(self) -> int:
        with self._cond:
            return len(self._items)

    def put(self, chunk: ScoredChunk) -> bool:
        """Add a chunk (waits for room); False if the queue was closed meanwhile."""
        with self._cond:
            self._cond.wait_for(lambda: len(self._items) < self.capacity or self._closed)
            if self._closed:
                return False
            self._items.append(chunk)
            self._cond.notify_all()
            return True

    def take(self) -> ScoredChunk:
        """The oldest chunk (waits for one); raises :class:`RolloutFailed` after :meth:`fail`."""
        with self._cond:
            self._cond.wait_for(lambda: self._items or self._error is not None or self._closed)
            if self._error is not None and not self._items:
                raise RolloutFailed(f"the rollouter failed: {type(self._error).__name__}: {self._error}") from self._error
            if not self._items:
                raise RolloutFailed("the rollouter stopped before the trainer had its samples")
            chunk = self._items.popleft()
            self._cond.notify_all()
            return chunk

    def fail(self, error: BaseException) -> None:
        with self._cond:
            self._error = error
            self._cond.notify_all()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
