"""Packing a DataProto's three parts into one TensorDict and back.

Tensors stay tensors; each non-tensor column becomes a ``NonTensorStack`` of per-row
``NonTensorData`` (built row by row so nested lists, dicts and chat messages stay whole
instead of being stacked into deeper dimensions); each meta value becomes one
``NonTensorData``. Unpacking sorts the entries back by those types.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from tensordict import NonTensorData, NonTensorStack, TensorCollection, TensorDict

from hybridflow.protocol.errors import DataProtoError, DataProtoTypeError
from hybridflow.protocol.rows import object_array


def pack_tensordict(
    batch: TensorDict | None, non_tensor_batch: dict[str, np.ndarray], meta_info: dict[str, Any], length: int
) -> TensorDict:
    """One TensorDict of batch size ``(length,)`` holding all three parts."""
    out = TensorDict({} if batch is None else dict(batch.items()), batch_size=[length])
    for key, array in non_tensor_batch.items():
        _check_free_key(out, key, "non_tensor_batch")
        out[key] = NonTensorStack(*[NonTensorData(value) for value in array], batch_size=[len(array)])
    for key, value in meta_info.items():
        _check_free_key(out, key, "meta_info")
        out[key] = NonTensorData(value)
    return out


def unpack_tensordict(
    tensor_dict: TensorDict, num_batch_dims: int = 1
) -> tuple[TensorDict | None, dict[str, np.ndarray], dict[str, Any]]:
    """``(batch, non_tensor_batch, meta_info)``; non-tensor columns become 1-D object arrays."""
    if not isinstance(tensor_dict, TensorDict):
        raise DataProtoTypeError(f"from_tensordict expects a TensorDict, got {type(tensor_dict).__name__}")
    if len(tensor_dict.batch_size) != num_batch_dims:
        raise DataProtoError(
            f"from_tensordict: batch_size {tuple(tensor_dict.batch_size)} does not have "
            f"num_batch_dims={num_batch_dims} dims"
        )
    tensors: dict[str, torch.Tensor | TensorCollection] = {}  # a nested TensorDict stays one entry
    non_tensors: dict[str, np.ndarray] = {}
    meta: dict[str, Any] = {}
    for key, value in tensor_dict.items():
        if isinstance(value, NonTensorStack):
            non_tensors[key] = object_array(value.tolist())
        elif isinstance(value, NonTensorData):
            meta[key] = value.data
        else:
            tensors[key] = value
    batch = None
    if tensors:
        batch = TensorDict(tensors, batch_size=tensor_dict.batch_size, device=tensor_dict.device)
    return batch, non_tensors, meta


def _check_free_key(td: TensorDict, key: str, part: str) -> None:
    if key in td.keys():
        raise DataProtoError(f"to_tensordict: {part} key {key!r} clashes with a key already in the TensorDict")
