"""The rule that a ``DataProto``'s three parts agree: types, one batch dimension, equal row counts.

:meth:`~hybridflow.protocol.dataproto.DataProto.check_consistency` runs it on construction and
after every in-place merge.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from tensordict import TensorDict

from hybridflow.protocol.errors import DataProtoError, DataProtoTypeError


def check_parts(batch: Any, non_tensor_batch: Any, meta_info: Any) -> None:
    """Raise if the parts disagree: one batch dim when there are non-tensors, equal lengths."""
    if batch is not None and not isinstance(batch, TensorDict):
        raise DataProtoTypeError(f"DataProto.batch must be a TensorDict or None, got {type(batch).__name__}")
    if not isinstance(non_tensor_batch, dict):
        raise DataProtoTypeError(f"DataProto.non_tensor_batch must be a dict, got {type(non_tensor_batch).__name__}")
    if not isinstance(meta_info, dict):
        raise DataProtoTypeError(f"DataProto.meta_info must be a dict, got {type(meta_info).__name__}")
    if batch is not None and len(batch.batch_size) == 0:
        raise DataProtoError("DataProto.batch needs a batch dimension, got batch_size ()")
    if batch is not None and non_tensor_batch and len(batch.batch_size) != 1:
        raise DataProtoError(
            f"DataProto supports one batch dim when non_tensor_batch is not empty, got batch_size "
            f"{tuple(batch.batch_size)}"
        )
    expected = None if batch is None else int(batch.batch_size[0])
    for key, value in non_tensor_batch.items():
        if not isinstance(value, np.ndarray):
            raise DataProtoTypeError(f"non_tensor_batch[{key!r}] must be a numpy ndarray, got {type(value).__name__}")
        if value.ndim == 0:
            raise DataProtoError(f"non_tensor_batch[{key!r}] is a 0-d array; it needs one entry per row")
        if expected is None:
            expected = value.shape[0]
        elif value.shape[0] != expected:
            raise DataProtoError(f"non_tensor_batch[{key!r}] has {value.shape[0]} rows, expected {expected}")
