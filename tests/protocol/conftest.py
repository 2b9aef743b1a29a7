"""Shared small DataProto builders for the protocol tests."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hybridflow import fields as F
from hybridflow.protocol import DataProto


def build_proto(n: int = 4, meta: dict | None = None) -> DataProto:
    """Row i has input_ids [i, 10+i, 20+i], score i/2, uid f"u{i}" and extra_info {"index": i}."""
    rows = torch.arange(n)
    tensors = {
        F.INPUT_IDS: torch.stack([rows, rows + 10, rows + 20], dim=1),
        "score": rows.float() / 2,
    }
    non_tensors = {
        F.UID: np.array([f"u{i}" for i in range(n)], dtype=object),
        F.EXTRA_INFO: np.array([{"index": i} for i in range(n)], dtype=object),
    }
    return DataProto.from_dict(tensors, non_tensors, meta_info={"temperature": 1.0} if meta is None else meta)


@pytest.fixture
def proto() -> DataProto:
    return build_proto()


@pytest.fixture
def make_proto():
    """The builder itself, for tests that need several sizes."""
    return build_proto
