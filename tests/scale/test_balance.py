"""trainer.balance_batch: equal rows per rank, token sums balanced, rows only moved."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hybridflow import fields as FK
from hybridflow.protocol import DataProto
from hybridflow.trainer.balance import balance_batch, balanced_order, chunk_token_sums


def test_hand_computed_order() -> None:
    # longest first: 10→A, 9→B, 8→B (9 < 10), 1→A, 1→A (A full), 1→B → A={0,3,4}=12, B={1,2,5}=18
    lengths = [10, 9, 8, 1, 1, 1]
    order = balanced_order(lengths, 2)
    assert order == [0, 3, 4, 1, 2, 5]
    assert chunk_token_sums(lengths, order, 2) == [12, 18]  # the best split into 3 + 3 rows


def test_sorted_lengths_are_spread_over_ranks() -> None:
    lengths = [8, 8, 7, 7, 2, 2, 1, 1]  # consecutive chunks: 30 vs 6
    order = balanced_order(lengths, 2)
    assert sorted(order) == list(range(8))
    assert chunk_token_sums(lengths, list(range(8)), 2) == [30, 6]
    assert chunk_token_sums(lengths, order, 2) == [18, 18]


def test_one_rank_and_errors() -> None:
    assert balanced_order([3, 1, 2], 1) == [0, 1, 2]
    with pytest.raises(ValueError, match="5 rows over 2 ranks"):
        balanced_order([1] * 5, 2)
    with pytest.raises(ValueError, match="dp_size must be >= 1"):
        balanced_order([1], 0)


def test_balance_batch_reorders_rows_and_reports_metrics() -> None:
    lengths = torch.tensor([6, 6, 5, 5, 1, 1, 1, 1])
    mask = (torch.arange(6)[None, :] < lengths[:, None]).long()
    data = DataProto.from_dict(
        tensors={FK.ATTENTION_MASK: mask, "row": torch.arange(8)},
        non_tensors={"uid": np.array(list("aabbccdd"), dtype=object)},
    )
    metrics = balance_batch(data, dp_size=2)
    order = data.batch["row"].tolist()
    # 6→A, 6→B, 5→A (tie: lower chunk), 5→B, then the 1s alternate: A={0,2,4,6}, B={1,3,5,7}
    assert order == [0, 2, 4, 6, 1, 3, 5, 7]
    assert list(data.non_tensor_batch["uid"]) == [list("aabbccdd")[i] for i in order]  # rows move whole
    assert metrics == {
        "global_seqlen/min": 4.0, "global_seqlen/max": 22.0, "global_seqlen/minmax_diff": 18.0,
        "global_seqlen/balanced_min": 13.0, "global_seqlen/balanced_max": 13.0, "global_seqlen/mean": 13.0,
    }
