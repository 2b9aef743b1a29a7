"""The asynchronous schedule: chunk, update and sync sizes, and the staleness bound.

Versions count weight syncs: the rollout serves version v after the v-th sync. The trainer
consumes prompts in order; a *sync interval* j is the ``sync_every`` local updates between
syncs j and j + 1, and trains prompts [j·B, (j+1)·B) (B = ``prompts_per_interval``) with the
actor that started from version j. A prompt generated with version v and trained in interval
j has staleness j − v. The bound ``threshold`` s is kept by admission: the rollouter starts
the chunk whose first prompt is i only once the version is ≥ ⌊i / B⌋ − s. So

* s = 0: chunk i waits for the sync that starts its own interval — generation and training
  alternate, exactly the synchronous schedule;
* ``one_step_off`` (s = 1, one update per sync, chunk = update = train_batch_size): batch k + 1
  is generated with θ_k while the trainer computes θ_k+1 from batch k; staleness exactly 1
  (0 for the first batch).

The trainer checks every chunk against the bound again before training it and drops (and
counts) one over it, so a scheduling bug cannot silently train stale data.
"""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import dataclass

from hybridflow.config import PPOConfig


@dataclass(frozen=True)
class AsyncSchedule:
    """``chunk_prompts`` per generation call, ``update_prompts`` per local update (a multiple of
    the chunk), ``sync_every`` updates per weight sync, staleness ``threshold`` (in syncs)."""

    chunk_prompts: int
    update_prompts: int
    sync_every: int
    threshold: int

    def __post_init__(self) -> None:
        if self.chunk_prompts < 1 or self.update_prompts % self.chunk_prompts:
            raise ValueError(f"update_prompts ({self.update_prompts}) must be a multiple of chunk_prompts "
                             f"({self.chunk_prompts})")
        if self.sync_every < 1 or self.threshold < 0:
            raise ValueError("sync_every must be >= 1 and threshold >= 0")

    @property
    def prompts_per_interval(self) -> int:
        return self.update_prompts * self.sync_every

    @property
    def chunks_per_update(self) -> int:
        return self.update_prompts // self.chunk_prompts

    def interval_of(self, chunk: int) -> int:
        """The sync interval whose updates train chunk ``chunk``."""
        return chunk * self.chunk_prompts // self.prompts_per_interval

    def version_needed(self, chunk: int) -> int:
        """The weight version the rollout must serve before generating chunk ``chunk``."""
        return max(0, self.interval_of(chunk) - self.threshold)

    def max_queued_chunks(self) -> int:
        """Chunks that can be generated ahead of the trainer under the bound (the queue's size)."""
        return (self.threshold + 1) * self.prompts_per_interval // self.chunk_prompts

    @classmethod
    def from_config(cls, config: PPOConfig) -> AsyncSchedule:
        at = config.async_training
        batch = config.data.train_batch_size
        if at.mode == "one_step_off":
            return cls(chunk_prompts=batch, update_prompts=batch, sync_every=1, threshold=1)
        if at.mode == "fully_async":
            mini = config.actor_rollout_ref.actor.ppo_mini_batch_size
            return cls(chunk_prompts=mini, update_prompts=mini * at.require_batches,
                       sync_every=at.trigger_parameter_sync_step, threshold=at.staleness_threshold)
        raise ValueError(f"async_training.mode={at.mode} is not an asynchronous mode")


class VersionGate:
    """The rollout's weight version, shared by the two threads.

    ``generation`` is held by the rollouter while it generates a chunk and by the trainer
    while it syncs weights or validates: a sync waits for the chunk in flight (it drains), and
    no chunk mixes two versions. :meth:`wait_for` blocks the rollouter until a version is
    reached (or the run stops).
    """

    def __init__(self) -> None:
        self.version = 0
        self.generation = threading.Lock()
        self._changed = threading.Condition()
        self.stopped = False

    def advance(self) -> int:
        with self._changed:
            self.version += 1
            self._changed.notify_all()
            return self.version

    def stop(self) -> None:
        with self._changed:
            self.stopped = True
            self._changed.notify_all()

    def wait_for(self, version: int) -> bool:
        """True once ``version`` is served; False if the run stopped first."""
        with self._changed:
            self._changed.wait_for(lambda: self.version >= version or self.stopped)
            return not self.stopped


def staleness_metrics(staleness: list[int], dropped: int, dropped_total: int) -> dict[str, float]:
    """verl-style ``fully_async/*`` staleness metrics of one update's chunks."""
    counts = Counter(staleness)
    metrics = {
        "fully_async/staleness/mean": sum(staleness) / len(staleness) if staleness else 0.0,
        "fully_async/staleness/max": float(max(staleness, default=0)),
        "fully_async/dropped_samples": float(dropped),
        "fully_async/dropped_samples_total": float(dropped_total),
    }
    for value, count in sorted(counts.items()):
        metrics[f"fully_async/staleness_hist/{value}"] = count / len(staleness)
    return metrics
