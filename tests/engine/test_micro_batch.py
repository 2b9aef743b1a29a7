"""Micro-batch plans: by count, by token budget (grouped by length), order restoration."""

from __future__ import annotations

import pytest
import torch

from hybridflow.engine.micro_batch import MicroBatchSpec, plan_micro_batches, restore_order


def test_by_count_groups_similar_lengths() -> None:
    # longest first: 5(0) 4(4) 3(2) 2(3) 1(1), then `size` rows at a time
    assert plan_micro_batches([5, 1, 3, 2, 4], MicroBatchSpec(size=2)) == [[0, 4], [2, 3], [1]]


def test_by_count_ties_keep_batch_order() -> None:
    assert plan_micro_batches([3, 3, 3, 3, 3], MicroBatchSpec(size=2)) == [[0, 1], [2, 3], [4]]


def test_by_tokens_groups_similar_lengths() -> None:
    # sorted longest first: 9(0) 8(3) 7(5) 3(1) 2(2) 2(4); budget 16 = rows × longest
    plan = plan_micro_batches([9, 3, 2, 8, 2, 7], MicroBatchSpec(max_token_len=16))
    assert plan == [[0], [3, 5], [1, 2, 4]]
    for micro in plan:
        lengths = [[9, 3, 2, 8, 2, 7][i] for i in micro]
        assert len(micro) * max(lengths) <= 16


def test_by_tokens_ties_keep_batch_order() -> None:
    assert plan_micro_batches([4, 4, 4, 4], MicroBatchSpec(max_token_len=8)) == [[0, 1], [2, 3]]


def test_token_budget_smaller_than_a_row_is_an_error() -> None:
    with pytest.raises(ValueError, match=r"max_token_len \(5\) is smaller than the longest row \(6 tokens\)"):
        plan_micro_batches([6, 1], MicroBatchSpec(max_token_len=5))


@pytest.mark.parametrize(
    "kwargs, message",
    [({}, "exactly one"), ({"size": 2, "max_token_len": 8}, "exactly one"), ({"size": 0}, ">= 1"),
     ({"max_token_len": 0}, ">= 1")],
)
def test_spec_validation(kwargs, message) -> None:
    with pytest.raises(ValueError, match=message):
        MicroBatchSpec(**kwargs)


def test_restore_order_inverts_any_plan() -> None:
    values = torch.arange(6).float().unsqueeze(1) * 10
    plan = [[4, 0], [5], [2, 3, 1]]
    parts = [values[torch.tensor(p)] for p in plan]
    assert torch.equal(restore_order(parts, plan), values)


def test_restore_order_checks_part_count() -> None:
    with pytest.raises(ValueError, match="2 output parts for a plan of 1"):
        restore_order([torch.zeros(1), torch.zeros(1)], [[0, 1]])


def test_empty_batch_has_empty_plan() -> None:
    assert plan_micro_batches([], MicroBatchSpec(size=3)) == []
