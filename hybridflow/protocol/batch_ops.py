"""Module-level DataProto helpers: padding to a divisor, folding the batch dim, collation."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch
from tensordict import TensorCollection, TensorDict

from hybridflow.protocol.dataproto import DataProto, DataProtoItem
from hybridflow.protocol.errors import DataProtoError, DataProtoTypeError
from hybridflow.protocol.merge import list_of_dict_to_dict_of_list
from hybridflow.protocol.rows import check_positive_int, object_array


def pad_dataproto_to_divisor(data: DataProto, size_divisor: int) -> tuple[DataProto, int]:
    """Append rows taken cyclically from the start until ``len`` divides by ``size_divisor``.

    3 rows to a multiple of 7 → rows 0,1,2,0,1,2,0. Returns ``(padded, pad_size)``.
    """
    if not isinstance(data, DataProto):
        raise DataProtoTypeError(f"pad_dataproto_to_divisor expects a DataProto, got {type(data).__name__}")
    check_positive_int("size_divisor", size_divisor)
    pad_size = (-len(data)) % size_divisor
    if pad_size == 0:
        return data, 0
    if len(data) == 0:
        raise DataProtoError("cannot pad an empty DataProto: there is no row to copy")
    return data.select_idxs(np.arange(len(data) + pad_size) % len(data)), pad_size


def unpad_dataproto(data: DataProto, pad_size: int) -> DataProto:
    """Drop the last ``pad_size`` rows (the padding added by :func:`pad_dataproto_to_divisor`)."""
    if not 0 <= pad_size <= len(data):
        raise DataProtoError(f"pad_size must be in [0, {len(data)}], got {pad_size}")
    return data if pad_size == 0 else data[: len(data) - pad_size]


def fold_batch_dim(data: DataProto, new_batch_size: int) -> DataProto:
    """``B`` rows → ``new_batch_size`` rows of ``B / new_batch_size``: tensors ``(B, ...)`` →
    ``(new_batch_size, B/new_batch_size, ...)``, arrays likewise."""
    check_positive_int("new_batch_size", new_batch_size)
    if len(data) % new_batch_size != 0:
        raise DataProtoError(f"fold_batch_dim: {len(data)} rows do not divide into {new_batch_size}")
    group = len(data) // new_batch_size
    batch = None
    if data.batch is not None:
        folded = {k: v.reshape(new_batch_size, group, *v.shape[1:]) for k, v in data.batch.items()}
        batch = TensorDict(folded, batch_size=[new_batch_size], device=data.batch.device)
    arrays = {k: v.reshape(new_batch_size, group, *v.shape[1:]) for k, v in data.non_tensor_batch.items()}
    return type(data)(batch=batch, non_tensor_batch=arrays, meta_info=data.meta_info)


def unfold_batch_dim(data: DataProto, batch_dims: int = 2) -> DataProto:
    """Merge the first ``batch_dims`` dims of every tensor and array into one batch dim."""
    check_positive_int("batch_dims", batch_dims)
    columns: list[tuple[str, torch.Tensor | TensorCollection | np.ndarray]] = []
    if data.batch is not None:
        columns += data.batch.items()
    columns += list(data.non_tensor_batch.items())
    leading = {tuple(v.shape[:batch_dims]) for _, v in columns}
    if len(leading) > 1 or any(v.ndim < batch_dims for _, v in columns):
        raise DataProtoError(
            f"unfold_batch_dim: every key needs the same first {batch_dims} dims, got {sorted(leading)}"
        )
    rows = math.prod(next(iter(leading))) if leading else 0
    batch = None
    if data.batch is not None:
        flat = {k: v.reshape(rows, *v.shape[batch_dims:]) for k, v in data.batch.items()}
        batch = TensorDict(flat, batch_size=[rows], device=data.batch.device)
    arrays = {k: v.reshape(rows, *v.shape[batch_dims:]) for k, v in data.non_tensor_batch.items()}
    return type(data)(batch=batch, non_tensor_batch=arrays, meta_info=data.meta_info)


def collate_fn(x: Sequence[DataProtoItem]) -> DataProto:
    """Stack single rows (e.g. from a DataLoader over a DataProto) into one DataProto."""
    if len(x) == 0:
        raise DataProtoError("collate_fn needs at least one DataProtoItem")
    batch = None
    if x[0].batch is not None:
        batch = TensorDict.stack([item.batch for item in x]).contiguous()  # = torch.stack on TensorDicts
    key_sets = [sorted(item.non_tensor_batch) for item in x]
    if any(keys != key_sets[0] for keys in key_sets):
        raise DataProtoError(f"collate_fn: items have different non-tensor keys: {key_sets[0]} vs others")
    columns = list_of_dict_to_dict_of_list([item.non_tensor_batch for item in x])
    arrays = {key: object_array(values) for key, values in columns.items()}
    return DataProto(batch=batch, non_tensor_batch=arrays, meta_info=dict(x[0].meta_info))
