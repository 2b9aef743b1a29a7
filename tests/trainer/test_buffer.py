"""The replay buffer: filters at admission, staleness eviction at take, splitting a sample
across updates, the reissue origin, and DAPO's filter driving an asynchronous rollouter."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch

from hybridflow import fields as F
from hybridflow.protocol import DataProto
from hybridflow.trainer.buffer import BufferFailed, ReplayBuffer, Sample, concat_samples
from hybridflow.trainer.filters import varied_group_rows
from hybridflow.trainer.schedules.plan import AsyncPlan, VersionGate
from hybridflow.trainer.schedules.rollouter import Rollouter

N = 2  # responses per prompt


def scored(first_prompt: int, scores: list[list[float]], seed: int = 0) -> DataProto:
    """Prompt groups numbered from ``first_prompt``; ``scores[g]`` the n responses' scores of group g."""
    rows = [(first_prompt + g, s) for g, group in enumerate(scores) for s in group]
    return DataProto.from_dict(
        tensors={"prompt_no": torch.tensor([p for p, _ in rows]), F.TOKEN_LEVEL_SCORES: torch.tensor([[s] for _, s in rows])},
        non_tensors={F.UID: np.array([f"u{p}" for p, _ in rows], dtype=object)},
        meta_info={"seed": seed, "temperature": 1.0},
    )


def varied(batch: DataProto):
    return varied_group_rows(batch.batch[F.TOKEN_LEVEL_SCORES].sum(-1).numpy(), batch.non_tensor_batch[F.UID])


def origins(first: int, count: int):
    return [({"epoch": 0}, first + k) for k in range(count)]


def test_the_filter_runs_at_admission_and_keeps_origins_aligned():
    buffer = ReplayBuffer(group_filter=varied)
    # groups 0 and 2 score alike (no gradient under GRPO): dropped before they enter
    assert buffer.put(Sample(0, 3, 0, scored(0, [[1, 1], [0, 1], [0, 0]]), origins=origins(0, 3)))
    assert len(buffer) == 1 and buffer.admitted == 1 and buffer.filtered_groups == 2
    assert buffer.first_origin() == ({"epoch": 0}, 1)
    taken = buffer.take(1)
    assert taken.samples[0].batch.batch["prompt_no"].tolist() == [1, 1]


def test_a_sample_splits_across_updates_and_its_metrics_go_with_the_first_part():
    buffer = ReplayBuffer()
    buffer.put(Sample(0, 3, 0, scored(0, [[1, 0]] * 3), metrics={"reward/errors": 2.0}, origins=origins(0, 3)))
    first = buffer.take(2)
    assert [s.groups for s in first.samples] == [2] and first.samples[0].metrics == {"reward/errors": 2.0}
    assert first.samples[0].batch.batch["prompt_no"].tolist() == [0, 0, 1, 1]
    assert len(buffer) == 1 and buffer.first_origin() == ({"epoch": 0}, 2)  # the reissue point moves on
    rest = buffer.take(1)
    assert rest.samples[0].metrics == {} and rest.samples[0].batch.batch["prompt_no"].tolist() == [2, 2]


def test_stale_samples_are_evicted_and_counted():
    buffer = ReplayBuffer()
    for version in (0, 1, 2):
        buffer.put(Sample(version, 1, version, scored(version, [[1, 0]])))
    taken = buffer.take(1, version=3, max_staleness=1)  # versions 0 and 1 are 3 and 2 versions old
    assert taken.evicted_groups == 2 and taken.staleness == [1] and taken.samples[0].version == 2


def test_concat_keeps_only_the_meta_the_samples_share():
    a, b = Sample(0, 1, 0, scored(0, [[1, 0]], seed=1)), Sample(1, 1, 0, scored(1, [[1, 0]], seed=2))
    batch = concat_samples([a, b])
    assert batch.meta_info == {"temperature": 1.0} and batch.batch["prompt_no"].tolist() == [0, 0, 1, 1]


def test_put_waits_for_room_and_a_failure_reaches_the_taker():
    buffer = ReplayBuffer(capacity=1)
    buffer.put(Sample(0, 1, 0, scored(0, [[1, 0]])))
    done = threading.Event()
    threading.Thread(target=lambda: (buffer.put(Sample(1, 1, 0, scored(1, [[1, 0]]))), done.set()), daemon=True).start()
    assert not done.wait(0.2)  # full: the producer waits
    buffer.take(1)
    assert done.wait(5)
    buffer.take(1)
    buffer.fail(ValueError("reward function exploded"))
    with pytest.raises(BufferFailed, match="reward function exploded"):
        buffer.take(1)


class CountingPrompts:
    """Prompt chunks numbered in order; every third prompt's group scores alike (filtered)."""

    def __init__(self, size: int) -> None:
        self.size, self.taken = size, 0

    def origin(self):
        return ({}, self.taken)

    def next(self):
        first, self.taken = self.taken, self.taken + self.size
        return first, origins(first, self.size)


def test_dapo_filtering_under_a_rollouter_trains_every_varied_prompt_once_within_the_bound():
    plan = AsyncPlan(chunk_prompts=2, update_prompts=4, sync_every=1, threshold=1)
    gate, buffer = VersionGate(), ReplayBuffer(plan.capacity(), group_filter=varied)

    def produce(chunk: int, first: int, version: int) -> Sample:
        scores = [[1, 1] if (first + g) % 3 == 0 else [0, 1] for g in range(plan.chunk_prompts)]
        return Sample(chunk, plan.chunk_prompts, version, scored(first, scores))

    rollouter = Rollouter(produce, CountingPrompts(plan.chunk_prompts), plan, gate, buffer)
    rollouter.start()
    trained = []
    try:
        for update in range(1, 9):
            taken = buffer.take(plan.update_prompts, version=update - 1, max_staleness=plan.threshold)
            assert taken.evicted_groups == 0 and all(0 <= age <= 1 for age in taken.staleness)
            trained += concat_samples(taken.samples).batch["prompt_no"][::N].tolist()
            with gate.generation:
                gate.advance()
    finally:
        gate.stop()
        buffer.close()
        rollouter.join(10)
    varied_prompts = [p for p in range(100) if p % 3 != 0]
    assert trained == varied_prompts[: len(trained)] and len(trained) == 32


def test_dapo_gives_up_when_too_few_groups_vary():
    plan = AsyncPlan(chunk_prompts=2, update_prompts=2, sync_every=1, threshold=0)
    gate, buffer = VersionGate(), ReplayBuffer(plan.capacity(), group_filter=varied)

    def produce(chunk: int, first: int, version: int) -> Sample:
        return Sample(chunk, 2, version, scored(first, [[1, 1], [1, 1]]))  # nothing ever varies

    def give_up(chunks: int, groups: int):
        return RuntimeError(f"{chunks} chunks left {groups} groups") if chunks >= 3 else None

    rollouter = Rollouter(produce, CountingPrompts(2), plan, gate, buffer, give_up=give_up)
    rollouter.start()
    with pytest.raises(BufferFailed, match="3 chunks left 0 groups"):
        buffer.take(2)
    gate.stop()
    rollouter.join(10)
