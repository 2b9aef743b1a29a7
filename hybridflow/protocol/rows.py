"""Small row-level helpers shared by ``DataProto`` methods: index normalisation, object
arrays, argument checks and the per-column step of ``unfold_column_chunks``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from hybridflow.protocol.errors import DataProtoError, DataProtoTypeError

IndexLike = Sequence[int] | Sequence[bool] | np.ndarray | torch.Tensor


def object_array(values: Sequence[Any]) -> np.ndarray:
    """A 1-D object array holding ``values`` as they are.

    ``np.array(list_of_lists, dtype=object)`` would build a 2-D array when the inner lists
    have equal lengths; filling an empty array keeps one element per row.
    """
    out = np.empty(len(values), dtype=object)
    for i, value in enumerate(values):
        out[i] = value
    return out


def as_row_index(idxs: IndexLike, length: int) -> tuple[torch.Tensor, np.ndarray]:
    """Normalise row indices to (int64 tensor, int64 ndarray); bool masks become positions."""
    if isinstance(idxs, torch.Tensor):
        array = idxs.detach().cpu().numpy()
    elif isinstance(idxs, np.ndarray):
        array = idxs
    elif isinstance(idxs, list | tuple | range):
        array = np.asarray(list(idxs)) if len(idxs) else np.zeros(0, dtype=np.int64)
    else:
        raise DataProtoTypeError(f"row indices must be a list, ndarray or tensor, got {type(idxs).__name__}")
    if array.ndim != 1:
        raise DataProtoError(f"row indices must be 1-D, got shape {array.shape}")
    if array.dtype == np.bool_:
        if array.shape[0] != length:
            raise DataProtoError(f"boolean mask has length {array.shape[0]} but the DataProto has {length} rows")
        array = np.nonzero(array)[0]
    elif not np.issubdtype(array.dtype, np.integer):
        raise DataProtoTypeError(f"row indices must be integers or booleans, got dtype {array.dtype}")
    array = array.astype(np.int64)
    if array.size and (array.max() >= length or array.min() < -length):
        raise IndexError(f"row index out of range for a DataProto of {length} rows")
    return torch.from_numpy(array), array


def check_positive_int(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value <= 0:
        raise DataProtoError(f"{name} must be a positive int, got {value!r}")


def is_scalar_index(item: Any) -> bool:
    return isinstance(item, np.ndarray | torch.Tensor) and item.ndim == 0


def unfold_or_repeat(key: str, value: Any, n_split: int, split: bool) -> Any:
    """``(B, n·k, ...)`` → ``(B·n, k, ...)`` when ``split``, else each row repeated n times."""
    if not split:
        if isinstance(value, np.ndarray):
            return np.repeat(value, n_split, axis=0)
        return torch.repeat_interleave(value, n_split, dim=0)
    if value.ndim < 2 or value.shape[1] % n_split != 0:
        raise DataProtoError(
            f"unfold_column_chunks: {key!r} has shape {tuple(value.shape)}; dim 1 must divide by {n_split}"
        )
    return value.reshape(value.shape[0] * n_split, value.shape[1] // n_split, *value.shape[2:])


def common_batch_shape(tensors: dict[str, Any], num_batch_dims: int) -> tuple[int, ...] | None:
    """The first ``num_batch_dims`` dims shared by all ``tensors`` (``None`` when there are none)."""
    batch_shape, pivot = None, None
    for key, tensor in tensors.items():
        if not isinstance(tensor, torch.Tensor):
            raise DataProtoTypeError(f"from_dict: tensors[{key!r}] is a {type(tensor).__name__}, not a torch.Tensor")
        if tensor.dim() < num_batch_dims:
            raise DataProtoError(
                f"from_dict: tensors[{key!r}] has {tensor.dim()} dims, fewer than num_batch_dims={num_batch_dims}"
            )
        shape = tuple(int(n) for n in tensor.shape[:num_batch_dims])
        if batch_shape is None:
            batch_shape, pivot = shape, key
        elif shape != batch_shape:
            raise DataProtoError(
                f"from_dict: tensors[{key!r}] has batch shape {shape} but tensors[{pivot!r}] has {batch_shape} "
                f"(num_batch_dims={num_batch_dims})"
            )
    return batch_shape


def as_object_column(key: str, value: Any) -> np.ndarray:
    """An ndarray as it is; a list or tuple as a 1-D object array (one entry per row)."""
    if isinstance(value, np.ndarray):
        return value
    if not isinstance(value, list | tuple):
        raise DataProtoTypeError(
            f"from_dict: non_tensors[{key!r}] is a {type(value).__name__}; expected an ndarray or list"
        )
    return object_array(value)
