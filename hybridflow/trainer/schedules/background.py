"""One-step-off and fully asynchronous schedules: a rollouter thread produces ahead of the trainer.

The trainer's loop is the synchronous one; only where its samples come from and when weights
move differ::

    rollouter:  chunk c: wait for version ≥ needed → produce (generate + score; generation lock)
                → replay buffer (filters at admission)
    trainer:    step k:  take the update's groups (evicting any over the staleness bound)
                         → phases 3–7 → every sync_every updates: sync weights (generation lock:
                           the chunk in flight finishes first, or is aborted and resumed with
                           partial rollout) and advance the version

Validation and checkpoints take the generation lock too, so they never run beside a chunk.
Metrics: the step's usual ones, the samples' generation-side ones (counters summed, the rest
averaged), ``fully_async/*`` (staleness histogram, evictions, buffer size, overlap; verl's
``fully_async/count/*``) and ``timing_s/wait_samples`` (the trainer waiting for the rollouter).
"""

from __future__ import annotations

import time
from contextlib import AbstractContextManager
from typing import Any

import numpy as np

from hybridflow import fields as F
from hybridflow.protocol import DataProto
from hybridflow.trainer.buffer import ReplayBuffer, Sample, concat_samples
from hybridflow.trainer.filters import group_filter, too_few_groups
from hybridflow.trainer.metrics import Timer
from hybridflow.trainer.schedules.base import TrainerState
from hybridflow.trainer.schedules.plan import AsyncPlan, VersionGate, staleness_metrics
from hybridflow.trainer.schedules.rollouter import PromptChunks, Rollouter

_SUMMED = ("reward/", "timing_s/")  # generation-side metrics that add up over samples


def merge_sample_metrics(samples: list[Sample]) -> dict[str, float]:
    """The samples' metrics as one step's: counters and times summed, everything else averaged."""
    keys = {k for sample in samples for k in sample.metrics}
    out = {}
    for key in keys:
        values = [sample.metrics[key] for sample in samples if key in sample.metrics]
        out[key] = sum(values) if key.startswith(_SUMMED) else sum(values) / len(values)
    return out


def overlap_seconds(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> float:
    """Total time covered by an interval of ``a`` and one of ``b`` at once (each list sorted, disjoint)."""
    total, i, j = 0.0, 0, 0
    while i < len(a) and j < len(b):
        start, end = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        total += max(0.0, end - start)
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


class BackgroundSchedule:
    """``async_training.mode``: ``one_step_off`` or ``fully_async``."""

    def __init__(self, trainer: TrainerState) -> None:
        self.trainer = trainer
        self.plan = AsyncPlan.from_config(trainer.config)
        self.partial_rollout = trainer.config.async_training.partial_rollout
        # On Ray the rollout has processes of its own: weights travel through the controller.
        self.remote_rollout = trainer.config.trainer.backend == "ray"
        self.gate = VersionGate()
        self.buffer = ReplayBuffer(self.plan.capacity(), group_filter(trainer.config))
        self.rollouter: Rollouter | None = None
        self.totals = {"dropped": 0, "stale_processed": 0}
        self.train_busy: list[tuple[float, float]] = []
        self.busy_from = self.started_at = 0.0

    def exclusive(self) -> AbstractContextManager[Any]:
        """Held while validating or checkpointing: the rollouter's engine and reward stay idle."""
        return self.gate.generation

    # ---- the rollouter's side -----------------------------------------------------------------
    def produce(self, chunk: int, prompts: DataProto, version: int) -> Sample:
        """Phases 0–2 for one chunk, on the rollouter thread. The chunk takes the seed and uids of
        step ``chunk // chunks_per_update + 1`` (its number within the step keeps the chunks'
        seeds apart), so a run with staleness 0 and one chunk per step samples exactly what the
        synchronous trainer samples."""
        per_update = self.plan.chunks_per_update
        timer = Timer()
        with timer.phase("gen_chunk"):
            out = self.trainer.producer.produce(prompts, chunk // per_update + 1, chunk % per_update, timer)
        batch, metrics = out.batch, out.metrics | timer.metrics()
        if self.partial_rollout:  # resumed across a sync: the oldest token decides its staleness
            version, metrics["fully_async/partial_resumed_fraction"] = self.generated_version(batch, version)
        else:  # the whole chunk came from one version: record it on every response
            stamp = np.full(len(batch), int(batch.meta_info.get(F.META_WEIGHT_VERSION, 0)), dtype=np.int64)
            batch.non_tensor_batch.setdefault(F.WEIGHT_VERSION_MIN, stamp)
            batch.non_tensor_batch.setdefault(F.WEIGHT_VERSION_MAX, stamp.copy())
        return Sample(chunk, len(prompts), version, batch, metrics, timer.timings["gen_chunk"])

    def generated_version(self, batch: DataProto, started_at: int) -> tuple[int, float]:
        """(the version, in syncs, of the chunk's oldest generated token; the fraction of its
        responses that span two or more versions). The rollout stamps global steps; syncs
        happen every ``sync_every`` steps."""
        low, high = batch.non_tensor_batch[F.WEIGHT_VERSION_MIN], batch.non_tensor_batch[F.WEIGHT_VERSION_MAX]
        stamped = [int(v) for v in low if int(v) >= 0]
        version = min(stamped) // self.plan.sync_every if stamped else started_at
        return version, float(sum(int(a) != int(b) for a, b in zip(low, high, strict=True)) / max(len(low), 1))

    def give_up(self, chunks: int, groups: int) -> BaseException | None:
        """DAPO's give-up rule, counted in whole updates' worth of chunks."""
        if self.buffer.group_filter is None:
            return None
        gen_batches = -(-chunks // self.plan.chunks_per_update)
        return too_few_groups(self.trainer.config, gen_batches, groups, self.plan.update_prompts)

    # ---- the trainer's side -------------------------------------------------------------------
    def start(self) -> None:
        """Start generating from the prompt the next step trains (after a resume too)."""
        trainer = self.trainer
        origin = trainer.resumed_state.get("async_prompt_origin")
        start = (trainer.resumed_state["dataloader"], int(origin)) if origin is not None else None
        # Versions count syncs; a resumed run's rollout already serves the resumed weights (the
        # resume synced them). From here on the rollout changes weights only at a sync.
        if not trainer.resumed_state:
            trainer.sync_rollout_weights()
        trainer.workers.rollout.set_pull_before_generating(False)
        trainer.workers.rollout.set_partial_rollout(self.partial_rollout)
        self.gate.version = trainer.global_steps // self.plan.sync_every
        self.buffer.admitted = trainer.global_steps * self.plan.update_prompts  # groups trained before a resume
        self.rollouter = Rollouter(
            self.produce,
            PromptChunks(trainer.train_loader, self.plan.chunk_prompts, start),
            self.plan,
            self.gate,
            self.buffer,
            start_chunk=trainer.global_steps * self.plan.chunks_per_update,
            hold_lock_while_generating=not self.partial_rollout,
            give_up=self.give_up,
        )
        self.started_at = time.perf_counter()
        self.rollouter.start()

    def stop(self) -> None:
        self.gate.stop()
        self.buffer.close()
        if self.rollouter is not None:
            self.rollouter.join(timeout=600)

    def next_batch(self, timer: Timer, metrics: dict[str, float], prompts: DataProto | None = None) -> DataProto:
        """The next update's groups from the buffer (stale ones evicted and counted)."""
        if prompts is not None:
            raise ValueError("an asynchronous schedule takes its prompts from the training loader, not from step()")
        interval = (self.trainer.global_steps - 1) // self.plan.sync_every  # the version this update starts from
        with timer.phase("wait_samples"):
            taken = self.buffer.take(self.plan.update_prompts, interval, self.plan.threshold)
        self.busy_from = time.perf_counter()
        self.totals["dropped"] += taken.evicted_groups
        self.totals["stale_processed"] += sum(s.groups for s, age in zip(taken.samples, taken.staleness) if age > 0)
        self.taken = taken
        metrics |= merge_sample_metrics(taken.samples)
        return concat_samples(taken.samples)

    def after_update(self, timer: Timer, metrics: dict[str, float]) -> None:
        """A weight sync every ``sync_every`` updates."""
        if self.trainer.global_steps % self.plan.sync_every == 0:
            with timer.phase("sync_weights"), self.gate.generation:
                metrics |= self.sync_weights()
        self.train_busy.append((self.busy_from, time.perf_counter()))

    def step_metrics(self) -> dict[str, float]:
        metrics = staleness_metrics(self.taken.staleness, self.taken.evicted_groups, self.totals)
        metrics |= self.overlap_metrics()
        metrics["fully_async/queue_size"] = float(len(self.buffer))
        metrics["fully_async/weight_version"] = float(self.gate.version)
        metrics["fully_async/count/current_param_version"] = float(self.gate.version)
        return metrics

    def sync_weights(self) -> dict[str, float]:
        """The rollout takes the actor's weights; the version advances. Drain: the chunk in
        flight has finished (the rollouter held the lock). Partial rollout: its requests are
        aborted (they keep their tokens and wait), the weights swapped, the requests resumed."""
        rollout, metrics = self.trainer.workers.rollout, {}
        if self.partial_rollout:
            metrics["fully_async/aborted_requests"] = float(rollout.abort_generation()[0])
        try:
            metrics |= self.sync_rollout_weights()
        finally:
            if self.partial_rollout:
                rollout.resume_generation()
        self.gate.advance()
        return metrics

    def sync_rollout_weights(self) -> dict[str, float]:
        """The actor's weights to the rollout, stamped with the step: pulled by a colocated
        rollout, or (Ray, the rollout in its own processes) exported by the actor's rank 0 and
        handed over by the controller."""
        trainer = self.trainer
        if not self.remote_rollout:
            return trainer.workers.rollout.update_weights(version=trainer.global_steps)[0]
        weights = trainer.workers.actor.export_sync_weights()[0]
        return trainer.workers.rollout.update_weights(weights, version=trainer.global_steps)[0]

    def overlap_metrics(self) -> dict[str, float]:
        """How much of the run so far both sides were busy at once (generating / training)."""
        wall = time.perf_counter() - self.started_at
        gen_busy = list(self.rollouter.busy) if self.rollouter is not None else []
        both = overlap_seconds(gen_busy, self.train_busy)
        return {
            "fully_async/overlap_fraction": both / wall if wall > 0 else 0.0,
            "fully_async/rollouter_busy_fraction": sum(e - s for s, e in gen_busy) / wall if wall > 0 else 0.0,
            "fully_async/trainer_busy_fraction": sum(e - s for s, e in self.train_busy) / wall if wall > 0 else 0.0,
        }

    def controller_state(self) -> dict[str, Any]:
        """Where generation restarts after a resume: the first prompt not trained yet (the
        rollouter is ahead of the trainer; what it generated beyond is generated again)."""
        if self.rollouter is None:
            return {}
        loader_state, offset = self.rollouter.reissue_origin()
        return {"dataloader": loader_state, "async_prompt_origin": offset}
