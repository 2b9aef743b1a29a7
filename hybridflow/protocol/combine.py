"""The work behind ``DataProto.union`` and ``DataProto.concat``: whole DataProtos combined.

``union`` puts two DataProtos of the same rows side by side (a key in both must agree);
``concat`` stacks the rows of several with the same keys. Both return the three parts; the
class builds (or updates) the DataProto from them, so the merge rules (:mod:`.merge`) stay
free of the class.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np
from tensordict import TensorDict

from hybridflow.protocol.errors import DataProtoError
from hybridflow.protocol.merge import (
    check_same_keys,
    merge_meta_info,
    union_numpy_dict,
    union_tensor_dict,
    union_two_dict,
)

Parts = tuple[TensorDict | None, dict[str, np.ndarray], dict[str, Any]]


class DataParts(Protocol):
    """What is read of a DataProto here (the class is not imported: it imports this module)."""

    batch: TensorDict | None
    non_tensor_batch: dict[str, np.ndarray]
    meta_info: dict[str, Any]

    def __len__(self) -> int: ...


def union_parts(left: DataParts, right: DataParts) -> Parts:
    """``(batch, non_tensor_batch, meta_info)`` of ``left`` and ``right`` together.

    Lengths must match where both have rows; a key in both must hold equal values, else
    ``ValueError`` naming the key (see :mod:`.merge`).
    """
    if _has_rows(left) and _has_rows(right) and len(left) != len(right):
        raise DataProtoError(f"union: lengths differ: {len(left)} vs {len(right)}")
    batch = left.batch
    if batch is None:
        batch = right.batch
    elif right.batch is not None:
        batch = union_tensor_dict(batch, right.batch)
    non_tensors = union_numpy_dict(left.non_tensor_batch, right.non_tensor_batch)
    return batch, non_tensors, union_two_dict(left.meta_info, right.meta_info)


def concat_parts(data: Sequence[DataParts]) -> Parts:
    """``(batch, non_tensor_batch, meta_info)`` of the rows of all ``data`` in order.

    Every part must have the same keys; meta ``metrics`` are merged into one dict of lists,
    other meta keys must agree across parts.
    """
    if len(data) == 0:
        raise DataProtoError("DataProto.concat needs at least one DataProto")
    batches = [d.batch for d in data if d.batch is not None]
    if batches and len(batches) != len(data):
        raise DataProtoError("DataProto.concat: some parts have a tensor batch and others do not")
    batch: TensorDict | None = None
    if batches:
        check_same_keys("batch", [sorted(str(k) for k in b.keys()) for b in batches])  # top-level keys: str
        batch = TensorDict.cat(batches, dim=0)  # what torch.cat on TensorDicts dispatches to
    check_same_keys("non_tensor_batch", [sorted(d.non_tensor_batch) for d in data])
    non_tensors = {
        key: np.concatenate([d.non_tensor_batch[key] for d in data], axis=0) for key in data[0].non_tensor_batch
    }
    return batch, non_tensors, merge_meta_info([d.meta_info for d in data])


def _has_rows(data: DataParts) -> bool:
    return data.batch is not None or bool(data.non_tensor_batch)
