"""Pure pieces of data-parallel training: equal micro-batch counts, global loss normalisers."""

from __future__ import annotations

import pytest
import torch

from hybridflow.engine.micro_batch import MicroBatchSpec, plan_micro_batches, split_plan_to
from hybridflow.workers.data_parallel import dp_global_batch_info


def test_split_plan_halves_the_largest_micro_batch_first() -> None:
    assert split_plan_to([[0, 1, 2], [3]], 2) == [[0, 1, 2], [3]]
    assert split_plan_to([[0, 1, 2], [3]], 3) == [[0, 1], [2], [3]]
    assert split_plan_to([[0, 1], [2, 3, 4]], 3) == [[0, 1], [2, 3], [4]]
    assert split_plan_to([[0, 1], [2, 3]], 3) == [[0], [1], [2, 3]]  # tie: the first one
    assert split_plan_to([[0, 1, 2], [3]], 4) == [[0], [1], [2], [3]]


def test_split_plan_keeps_token_budgets() -> None:
    lengths = [9, 3, 3, 3, 2, 2]
    plan = plan_micro_batches(lengths, MicroBatchSpec(max_token_len=9))
    assert plan == [[0], [1, 2, 3], [4, 5]]
    split = split_plan_to(plan, 5)
    assert split == [[0], [1], [2], [3], [4, 5]]  # [1,2,3] → [1,2],[3]; then the tie [1,2] vs [4,5]: first
    assert sorted(i for micro in split for i in micro) == list(range(6))
    assert all(len(micro) * max(lengths[i] for i in micro) <= 9 for micro in split)


def test_split_plan_rejects_impossible_counts() -> None:
    with pytest.raises(ValueError, match="2 micro-batches over 3 rows into 4"):
        split_plan_to([[0, 1], [2]], 4)
    with pytest.raises(ValueError, match="into 1 micro-batches"):
        split_plan_to([[0], [1]], 1)


def test_one_rank_uses_local_counts() -> None:
    mask = torch.tensor([[1.0, 1.0, 0.0], [0.0, 0.0, 0.0], [1.0, 0.0, 0.0]])
    info = dp_global_batch_info(mask, dp_size=1, loss_scale_factor=3.0)
    assert float(info.batch_num_tokens) == 3.0 and int(info.global_batch_size) == 2
    assert info.dp_size == 1 and info.loss_scale_factor == 3.0


def test_several_ranks_without_a_process_group_is_an_error() -> None:
    with pytest.raises(RuntimeError, match="data-parallel size 2 needs a torch.distributed group of 2 ranks, found 1"):
        dp_global_batch_info(torch.ones(2, 3), dp_size=2)
