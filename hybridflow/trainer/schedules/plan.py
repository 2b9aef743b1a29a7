"""The asynchronous plan: chunk, update and sync sizes, and the staleness bound.

Versions count weight syncs: the rollout serves version v after the v-th sync. The trainer
consumes prompts in order; a *sync interval* j is the ``sync_every`` local updates between
syncs j and j + 1, and trains prompts [j·B, (j+1)·B) (B = ``prompts_per_interval``) with the
actor that started from version j. A prompt generated with version v and trained in interval
j has staleness j − v. The bound ``threshold`` s is kept by admission: the rollouter starts
a chunk whose first group would be trained as the i-th (counting the groups the replay buffer
admitted; a filter's dropped groups do not count) only once the version is ≥ ⌊i / B⌋ − s. So

* s = 0: chunk i waits for the sync that starts its own interval — generation and training
  alternate, exactly the synchronous schedule;
* ``one_step_off`` (s = 1, one update per sync, chunk = update = train_batch_size): batch k + 1
  is generated with θ_k while the trainer computes θ_k+1 from batch k; staleness exactly 1
  (0 for the first batch).

The replay buffer checks every sample against the bound again before it is trained and evicts
(and counts) one over it, so a scheduling bug cannot silently train stale data.
"""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import dataclass

from hybridflow.config import PPOConfig


@dataclass(frozen=True)
class AsyncPlan:
    """``chunk_prompts`` per generation call, ``update_prompts`` per local update (a multiple of
    the chunk), ``sync_every`` updates per weight sync, staleness ``threshold`` (in syncs)."""

    chunk_prompts: int
    update_prompts: int
    sync_every: int
    threshold: int

    def __post_init__(self) -> None:
        if self.chunk_prompts < 1 or self.update_prompts % self.chunk_prompts:
            raise ValueError(
                f"update_prompts ({self.update_prompts}) must be a multiple of chunk_prompts ({self.chunk_prompts})"
            )
        if self.sync_every < 1 or self.threshold < 0:
            raise ValueError("sync_every must be >= 1 and threshold >= 0")

    @property
    def prompts_per_interval(self) -> int:
        return self.update_prompts * self.sync_every

    @property
    def chunks_per_update(self) -> int:
        return self.update_prompts // self.chunk_prompts

    def interval_of(self, group: int) -> int:
        """The sync interval whose updates train the ``group``-th admitted prompt group."""
        return group // self.prompts_per_interval

    def version_needed(self, group: int) -> int:
        """The weight version the rollout must serve before generating a chunk whose first
        group would be the ``group``-th admitted one."""
        return max(0, self.interval_of(group) - self.threshold)

    def capacity(self) -> int:
        """Groups that can wait ahead of the trainer under the bound (the replay buffer's size)."""
        return (self.threshold + 1) * self.prompts_per_interval

    @classmethod
    def from_config(cls, config: PPOConfig) -> AsyncPlan:
        at = config.async_training
        batch = config.data.train_batch_size
        if at.mode == "one_step_off":
            return cls(chunk_prompts=batch, update_prompts=batch, sync_every=1, threshold=1)
        if at.mode == "fully_async":
            mini = config.actor_rollout_ref.actor.ppo_mini_batch_size
            return cls(
                chunk_prompts=mini,
                update_prompts=mini * at.require_batches,
                sync_every=at.trigger_parameter_sync_step,
                threshold=at.staleness_threshold,
            )
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


def staleness_metrics(staleness: list[int], dropped: int, totals: dict[str, int]) -> dict[str, float]:
    """``fully_async/*`` staleness metrics of one update's samples: ``staleness`` per sample,
    ``dropped`` prompts evicted for staleness by this update; ``totals``: the run's running
    counts (``dropped``, ``stale_processed``), reported under verl's ``fully_async/count/*`` names."""
    counts = Counter(staleness)
    metrics = {
        "fully_async/staleness/mean": sum(staleness) / len(staleness) if staleness else 0.0,
        "fully_async/staleness/max": float(max(staleness, default=0)),
        "fully_async/dropped_samples": float(dropped),
        "fully_async/dropped_samples_total": float(totals["dropped"]),
        "fully_async/count/dropped_stale_samples": float(totals["dropped"]),
        "fully_async/count/stale_samples_processed": float(totals["stale_processed"]),
    }
    for value, count in sorted(counts.items()):
        metrics[f"fully_async/staleness_hist/{value}"] = count / len(staleness)
    return metrics
