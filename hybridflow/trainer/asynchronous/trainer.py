"""``AsyncPPOTrainer``: the PPO trainer's phases, fed by a rollouter thread.

The loop reads like the synchronous one, except that phases 0–2 (prepare, generate, score)
run on the rollouter thread, ahead of the trainer::

    rollouter:  chunk c: wait for version ≥ needed(c) → generate + score (generation lock) → queue
    trainer:    step k:  take the update's chunks (drop any over the staleness bound)
                         → phases 3–7 (old logp = the rollout's in bypass mode, ref, adv, update)
                         → every sync_every updates: sync weights (generation lock: the chunk in
                           flight finishes first) and advance the version

Validation and checkpoints take the generation lock too, so they never run beside a chunk.
Metrics: the step's usual ones, the chunks' generation-side ones (counters summed, the rest
averaged), ``fully_async/*`` (staleness histogram, dropped samples, queue size, overlap) and
``timing_s/wait_samples`` (the trainer waiting for the rollouter).
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
from tqdm import tqdm

from hybridflow import fields as F
from hybridflow.protocol import DataProto
from hybridflow.trainer.asynchronous.queue import SampleQueue, ScoredChunk
from hybridflow.trainer.asynchronous.rollouter import PromptChunks, Rollouter
from hybridflow.trainer.asynchronous.schedule import AsyncSchedule, VersionGate, staleness_metrics
from hybridflow.trainer.metrics import Timer
from hybridflow.trainer.ppo_trainer import PPOTrainer

_SUMMED = ("reward/", "timing_s/")  # generation-side metrics that add up over chunks


def merge_chunk_metrics(chunks: list[ScoredChunk]) -> dict[str, float]:
    """The chunks' metrics as one step's: counters and times summed, everything else averaged."""
    keys = {k for chunk in chunks for k in chunk.metrics}
    out = {}
    for key in keys:
        values = [chunk.metrics[key] for chunk in chunks if key in chunk.metrics]
        out[key] = sum(values) if key.startswith(_SUMMED) else sum(values) / len(values)
    return out


def concat_chunks(chunks: list[ScoredChunk]) -> DataProto:
    """One batch of the chunks' rows, in order. Per-call facts that differ between chunks
    (each chunk's sampling seed) are dropped from ``meta_info``; the ones they share stay."""
    if len(chunks) == 1:
        return chunks[0].batch
    metas = [chunk.batch.meta_info for chunk in chunks]
    shared = {k: v for k, v in metas[0].items() if all(k in m and _same(m[k], v) for m in metas[1:])}
    for chunk in chunks:
        chunk.batch.meta_info = dict(shared)
    return DataProto.concat([chunk.batch for chunk in chunks])


def _same(a: Any, b: Any) -> bool:
    try:
        return bool(a == b)
    except (TypeError, ValueError):  # arrays compare element-wise
        return a is b


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


class AsyncPPOTrainer(PPOTrainer):
    """Asynchronous PPO/GRPO (``async_training.mode``: ``one_step_off`` or ``fully_async``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.schedule = AsyncSchedule.from_config(self.config)
        self.partial_rollout = self.config.async_training.partial_rollout
        # On Ray the rollout has processes of its own: weights travel through the controller.
        self.remote_rollout = self.config.trainer.backend == "ray"
        self.gate = VersionGate()
        self.queue = SampleQueue(self.schedule.max_queued_chunks())
        self.rollouter: Rollouter | None = None
        self.dropped_total = 0
        self.train_busy: list[tuple[float, float]] = []
        self.started_at = 0.0

    # ---- the rollouter's side -----------------------------------------------------------------
    def produce_chunk(self, chunk: int, prompts: DataProto, version: int) -> ScoredChunk:
        """Phases 0–2 for one chunk, on the rollouter thread. The chunk is trained at step
        ``chunk // chunks_per_update + 1``, whose seed and uids it takes (its number within the
        step keeps the chunks' seeds apart), so a run with staleness 0 and one chunk per step
        samples exactly what the synchronous trainer samples."""
        per_update = self.schedule.chunks_per_update
        timer, metrics = Timer(), {}
        with timer.phase("gen_chunk"):
            batch = self.generate_and_score(prompts, timer, metrics, gen_batch=chunk % per_update,
                                            step=chunk // per_update + 1)
        metrics |= timer.metrics()
        if self.partial_rollout:  # resumed across a sync: the oldest token decides its staleness
            version, metrics["fully_async/partial_resumed_fraction"] = self.generated_version(batch, version)
        else:  # the whole chunk came from one version: record it on every response
            stamp = np.full(len(batch), int(batch.meta_info.get("weight_version", 0)), dtype=np.int64)
            batch.non_tensor_batch.setdefault(F.WEIGHT_VERSION_MIN, stamp)
            batch.non_tensor_batch.setdefault(F.WEIGHT_VERSION_MAX, stamp.copy())
        return ScoredChunk(chunk, len(prompts), version, batch, metrics, timer.timings["gen_chunk"])

    def generated_version(self, batch: DataProto, started_at: int) -> tuple[int, float]:
        """(the version, in syncs, of the chunk's oldest generated token; the fraction of its
        responses that span two or more versions). The rollout stamps global steps; syncs
        happen every ``sync_every`` steps."""
        low, high = batch.non_tensor_batch[F.WEIGHT_VERSION_MIN], batch.non_tensor_batch[F.WEIGHT_VERSION_MAX]
        stamped = [int(v) for v in low if int(v) >= 0]
        version = min(stamped) // self.schedule.sync_every if stamped else started_at
        return version, float(sum(int(a) != int(b) for a, b in zip(low, high, strict=True)) / max(len(low), 1))

    # ---- the loop --------------------------------------------------------------------------------
    def fit(self) -> dict[str, float]:
        early = self.begin_fit()
        if early is not None:
            return early
        trainer_cfg = self.config.trainer
        self.start_rollouter()
        last: dict[str, float] = {}
        progress = tqdm(total=self.total_training_steps, initial=self.global_steps, desc="training", unit="step")
        try:
            while self.global_steps < self.total_training_steps:
                self.global_steps += 1
                last = self.async_step()
                is_last = self.global_steps == self.total_training_steps
                if (is_last or self._due(trainer_cfg.test_freq, is_last)) and self.val_loader is not None:
                    with self.gate.generation:  # the rollouter's reward manager and engine stay idle
                        last |= self.validate()
                self.tracking.log(last, step=self.global_steps)
                if self._due(trainer_cfg.save_freq, is_last):
                    with self.gate.generation:
                        self.save_checkpoint()
                progress.set_postfix(score=f"{last['critic/score/mean']:.3f}", step_s=f"{last['timing_s/step']:.1f}")
                progress.update(1)
        finally:
            self.stop_rollouter()
            progress.close()
        return last

    def start_rollouter(self) -> None:
        """Start generating from the chunk the next step trains (after a resume too)."""
        first = self.global_steps * self.schedule.chunks_per_update
        origin = self.resumed_state.get("async_prompt_origin")
        start = (self.resumed_state["dataloader"], int(origin)) if origin is not None else None
        # Versions count syncs; a resumed run's rollout already serves the resumed weights (the
        # resume synced them). From here on the rollout changes weights only at a sync, never on
        # its own before generating.
        if not self.resumed_state:
            self.sync_rollout_weights()
        self.workers.rollout.set_pull_before_generating(False)
        self.workers.rollout.set_partial_rollout(self.partial_rollout)
        self.gate.version = self.global_steps // self.schedule.sync_every
        self.rollouter = Rollouter(self.produce_chunk, PromptChunks(self.train_loader, self.schedule.chunk_prompts, start),
                                   self.schedule, self.gate, self.queue, start_chunk=first,
                                   hold_lock_while_generating=not self.partial_rollout)
        self.started_at = time.perf_counter()
        self.rollouter.start()

    def stop_rollouter(self) -> None:
        self.gate.stop()
        self.queue.close()
        if self.rollouter is not None:
            self.rollouter.join(timeout=600)

    def async_step(self) -> dict[str, float]:
        """One local update from the queue; a weight sync every ``sync_every`` updates."""
        timer, metrics = Timer(), {}
        with timer.phase("step"):
            with timer.phase("wait_samples"):
                chunks, staleness, dropped = self.take_chunks()
            busy_from = time.perf_counter()
            batch = concat_chunks(chunks)
            metrics |= merge_chunk_metrics(chunks)
            batch = self.update_policy(batch, timer, metrics)
            if self.global_steps % self.schedule.sync_every == 0:
                with timer.phase("sync_weights"), self.gate.generation:
                    metrics |= self.sync_weights()
            self.train_busy.append((busy_from, time.perf_counter()))
        self.dropped_total += dropped
        metrics |= staleness_metrics(staleness, dropped, self.dropped_total)
        metrics |= self.overlap_metrics()
        metrics["fully_async/queue_size"] = float(len(self.queue))
        metrics["fully_async/weight_version"] = float(self.gate.version)
        return self.step_metrics(batch, timer, metrics)

    def sync_weights(self) -> dict[str, float]:
        """The rollout takes the actor's weights; the version advances. Drain: the chunk in
        flight has finished (the rollouter held the lock). Partial rollout: its requests are
        aborted (they keep their tokens and wait), the weights swapped, the requests resumed."""
        metrics = {}
        if self.partial_rollout:
            metrics["fully_async/aborted_requests"] = float(self.workers.rollout.abort_generation()[0])
        try:
            metrics |= self.sync_rollout_weights()
        finally:
            if self.partial_rollout:
                self.workers.rollout.resume_generation()
        self.gate.advance()
        return metrics

    def sync_rollout_weights(self) -> dict[str, float]:
        """The actor's weights to the rollout, stamped with the step: pulled by a colocated
        rollout, or (Ray, the rollout in its own processes) exported by the actor's rank 0 and
        handed over by the controller."""
        if not self.remote_rollout:
            return super().sync_rollout_weights()
        weights = self.workers.actor.export_sync_weights()[0]
        return self.workers.rollout.update_weights(weights, version=self.global_steps)[0]

    def take_chunks(self) -> tuple[list[ScoredChunk], list[int], int]:
        """The next update's chunks, in order. A chunk over the staleness bound is dropped and
        counted (the schedule's admission should make that impossible), and another is taken."""
        interval = (self.global_steps - 1) // self.schedule.sync_every  # the version this update starts from
        chunks, staleness, dropped = [], [], 0
        while len(chunks) < self.schedule.chunks_per_update:
            chunk = self.queue.take()
            self.rollouter.forget(chunk.index)
            age = interval - chunk.version
            if age > self.schedule.threshold:
                dropped += chunk.prompts
                continue
            chunks.append(chunk)
            staleness.append(age)
        return chunks, staleness, dropped

    def overlap_metrics(self) -> dict[str, float]:
        """How much of the run so far both sides were busy at once (generating / training)."""
        wall = time.perf_counter() - self.started_at
        gen_busy = list(self.rollouter.busy)
        both = overlap_seconds(gen_busy, self.train_busy)
        return {
            "fully_async/overlap_fraction": both / wall if wall > 0 else 0.0,
            "fully_async/rollouter_busy_fraction": sum(e - s for s, e in gen_busy) / wall if wall > 0 else 0.0,
            "fully_async/trainer_busy_fraction": sum(e - s for s, e in self.train_busy) / wall if wall > 0 else 0.0,
        }

    # ---- checkpoints -------------------------------------------------------------------------------
    def controller_state(self) -> dict[str, Any]:
        """The loader position of the first chunk the next step trains (the rollouter is ahead
        of the trainer, and what it generated beyond is generated again after a resume)."""
        state = super().controller_state()
        next_chunk = self.global_steps * self.schedule.chunks_per_update
        loader_state, offset = self.rollouter.origin_of(next_chunk)
        state["dataloader"] = loader_state
        state["async_prompt_origin"] = offset
        return state
