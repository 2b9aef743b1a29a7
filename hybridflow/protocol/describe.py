"""A ``DataProto`` described for people: the memory its parts take, and a summary of its keys."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from tensordict import TensorDict


def size_message(batch: TensorDict | None, non_tensor_batch: dict[str, np.ndarray]) -> str:
    """The memory of the tensors and of the numpy arrays, in GB (verl's wording)."""
    leaves = [] if batch is None else batch.values(include_nested=True, leaves_only=True)
    tensor_bytes = sum(t.element_size() * t.numel() for t in leaves if isinstance(t, torch.Tensor))  # leaves: tensors
    array_bytes = sum(array.nbytes for array in non_tensor_batch.values())
    return f"Size of tensordict: {tensor_bytes / 1024**3} GB, size of non_tensor_batch: {array_bytes / 1024**3} GB"


def data_info(
    rows: int, batch: TensorDict | None, non_tensor_batch: dict[str, np.ndarray], meta_info: dict[str, Any]
) -> str:
    """A multi-line summary: each key with its shape and dtype, meta keys with their types."""
    lines = [f"DataProto with {rows} rows", "batch"]
    if batch is not None:
        for key, value in batch.items():
            lines.append(f"  {key}: {tuple(value.shape)} ({value.dtype}) {value.device}")
    lines.append("non_tensor_batch")
    for key, array in non_tensor_batch.items():
        lines.append(f"  {key}: ndarray{array.shape} ({array.dtype})")
    lines.append("meta_info")
    for key, value in meta_info.items():
        lines.append(f"  {key}: {type(value).__name__}")
    return "\n".join(lines)
