"""The asynchronous plan with a fake engine of controlled, random latencies: every trained
chunk is within the staleness bound, staleness 0 is exactly the synchronous sequence, and a
failing rollouter surfaces in the trainer — through the real replay buffer and rollouter."""

from __future__ import annotations

import random
import threading
import time

import pytest

from hybridflow.trainer.buffer import BufferFailed, ReplayBuffer, Sample
from hybridflow.trainer.schedules.background import overlap_seconds
from hybridflow.trainer.schedules.plan import AsyncPlan, VersionGate, staleness_metrics
from hybridflow.trainer.schedules.rollouter import Rollouter


class FakePrompts:
    """Prompt chunks numbered in order (the real one reads the loader)."""

    def __init__(self, size: int = 1) -> None:
        self.taken = 0
        self.size = size

    def origin(self):
        return ({}, self.taken)

    def next(self):
        self.taken += 1
        return self.taken - 1, [({}, self.taken - 1)] * self.size


def run_schedule(schedule: AsyncPlan, updates: int, seed: int, gen_s=(0.0, 0.004), train_s=(0.0, 0.004),
                 let_it_run_ahead: bool = False):
    """Drive a Rollouter with a fake engine and a fake trainer; returns [(update, chunk, version, age)].

    ``let_it_run_ahead``: before each sync the trainer waits until the rollouter can go no
    further (admission or a full queue stops it), so the rollouter is as far ahead as the
    bound allows however the threads are scheduled."""
    rng_gen, rng_train = random.Random(seed), random.Random(seed + 1)
    gate, queue = VersionGate(), ReplayBuffer(schedule.capacity())
    lock = threading.Lock()
    in_flight = []

    def produce(chunk: int, prompts: int, version: int) -> Sample:
        with lock:
            in_flight.append(version)
        time.sleep(rng_gen.uniform(*gen_s))
        assert gate.version == version, "a sync landed in the middle of a chunk"
        return Sample(chunk, schedule.chunk_prompts, version, batch=prompts)

    rollouter = Rollouter(produce, FakePrompts(schedule.chunk_prompts), schedule, gate, queue)
    rollouter.start()
    trained = []
    try:
        for update in range(1, updates + 1):
            interval = (update - 1) // schedule.sync_every
            for _ in range(schedule.chunks_per_update):
                taken = queue.take(schedule.chunk_prompts, interval)
                assert taken.evicted_groups == 0 and len(taken.samples) == 1
                chunk = taken.samples[0]
                trained.append((update, chunk.index, chunk.version, taken.staleness[0]))
            time.sleep(rng_train.uniform(*train_s))
            if update % schedule.sync_every == 0 and let_it_run_ahead:
                deadline = time.monotonic() + 10
                while (schedule.version_needed(queue.admitted) <= gate.version
                       and len(queue) < queue.capacity and time.monotonic() < deadline):
                    time.sleep(0.0005)
            if update % schedule.sync_every == 0:
                with gate.generation:
                    gate.advance()
    finally:
        gate.stop()
        queue.close()
        rollouter.join(10)
    return trained


@pytest.mark.parametrize(("threshold", "sync_every", "chunks_per_update"), [(0, 1, 1), (1, 1, 2), (2, 3, 2), (3, 2, 1)])
@pytest.mark.parametrize("seed", [0, 1])
def test_every_trained_chunk_is_within_the_bound(threshold, sync_every, chunks_per_update, seed):
    schedule = AsyncPlan(chunk_prompts=2, update_prompts=2 * chunks_per_update, sync_every=sync_every,
                             threshold=threshold)
    trained = run_schedule(schedule, updates=30, seed=seed)
    assert [c for _, c, _, _ in trained] == list(range(30 * chunks_per_update))  # in order, none lost or twice
    assert all(0 <= age <= threshold for *_, age in trained)


@pytest.mark.parametrize("threshold", [1, 2])
def test_fast_generation_runs_exactly_as_far_ahead_as_allowed(threshold):
    schedule = AsyncPlan(chunk_prompts=2, update_prompts=2, sync_every=2, threshold=threshold)
    trained = run_schedule(schedule, updates=24, seed=5, gen_s=(0.0, 0.0002), train_s=(0.0, 0.001),
                           let_it_run_ahead=True)
    ages = [age for *_, age in trained]
    # from the interval the rollouter first reaches the bound on, every chunk is exactly at it
    assert ages[2 * threshold * 2:] == [threshold] * (24 - 2 * threshold * 2)


def test_staleness_zero_is_the_synchronous_sequence():
    schedule = AsyncPlan(chunk_prompts=4, update_prompts=4, sync_every=1, threshold=0)
    trained = run_schedule(schedule, updates=20, seed=3, gen_s=(0.0, 0.002), train_s=(0.0, 0.002))
    # update k trains chunk k−1 generated with exactly the weights of version k−1: generate, train, sync, ...
    assert trained == [(k, k - 1, k - 1, 0) for k in range(1, 21)]


def test_one_step_off_has_staleness_exactly_one_after_the_first_batch():
    schedule = AsyncPlan(chunk_prompts=4, update_prompts=4, sync_every=1, threshold=1)
    trained = run_schedule(schedule, updates=20, seed=4, gen_s=(0.001, 0.002), train_s=(0.0, 0.002),
                           let_it_run_ahead=True)
    assert [age for *_, age in trained] == [0] + [1] * 19


def test_a_failing_rollouter_reaches_the_trainer():
    schedule = AsyncPlan(chunk_prompts=1, update_prompts=1, sync_every=1, threshold=1)
    gate, queue = VersionGate(), ReplayBuffer(schedule.capacity())

    def produce(chunk, prompts, version):
        raise ValueError("reward function exploded")

    rollouter = Rollouter(produce, FakePrompts(), schedule, gate, queue)
    rollouter.start()
    with pytest.raises(BufferFailed, match="reward function exploded"):
        queue.take(1)
    gate.stop()
    rollouter.join(10)


def test_schedule_sizes_and_helpers():
    schedule = AsyncPlan(chunk_prompts=2, update_prompts=4, sync_every=3, threshold=1)
    assert schedule.prompts_per_interval == 12 and schedule.chunks_per_update == 2
    # counted in admitted groups: chunk c starts at group 2c
    assert [schedule.version_needed(2 * c) for c in (0, 5, 6, 11, 12, 18)] == [0, 0, 0, 0, 1, 2]
    assert schedule.capacity() == 24  # 12 chunks of 2 groups
    with pytest.raises(ValueError, match="multiple"):
        AsyncPlan(chunk_prompts=3, update_prompts=4, sync_every=1, threshold=0)
    metrics = staleness_metrics([0, 1, 1, 1], dropped=2, totals={"dropped": 5, "stale_processed": 3})
    assert metrics["fully_async/staleness/mean"] == 0.75 and metrics["fully_async/staleness/max"] == 1
    assert metrics["fully_async/staleness_hist/1"] == 0.75 and metrics["fully_async/dropped_samples_total"] == 5
    assert metrics["fully_async/count/dropped_stale_samples"] == 5 and metrics["fully_async/count/stale_samples_processed"] == 3
    assert overlap_seconds([(0, 2), (3, 5)], [(1, 4)]) == 2.0
