"""Tensors and TensorDicts as plain ``(dtype, shape, bytes)`` tuples, in verl's format.

verl's protocol module exposes these four helpers (its workers send batches over ZMQ/Ray with
them); code written for verl imports them from ``verl.protocol``. The encodings are the same:

* one tensor → ``(dtype_name, shape, data)``: ``dtype_name`` without the ``torch.`` prefix
  (``"bfloat16"``), ``shape`` a ``torch.Size``, ``data`` the row-major bytes as a 1-D uint8
  numpy array (a view of the tensor's memory when it is contiguous on the CPU);
* a TensorDict → ``(batch_size, device, {key: encoding})`` where a nested tensor's encoding is
  ``(layout_name, [one encoding per component])``.

Decoding copies the bytes, so the decoded tensor owns writable memory whatever buffer held them.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from tensordict import TensorDict

from hybridflow.protocol.errors import DataProtoError, DataProtoTypeError

TensorEncoding = tuple[str, torch.Size, np.ndarray]


def serialize_single_tensor(obj: torch.Tensor) -> TensorEncoding:
    """``(dtype name, shape, uint8 bytes)`` of a dense tensor (moved to the CPU if needed)."""
    if not isinstance(obj, torch.Tensor):
        raise DataProtoTypeError(f"serialize_single_tensor expects a torch.Tensor, got {type(obj).__name__}")
    flat = obj.detach().reshape(-1).contiguous().cpu()
    return str(obj.dtype).removeprefix("torch."), obj.shape, flat.view(torch.uint8).numpy()


def deserialize_single_tensor(arr: Any) -> torch.Tensor:
    """Inverse of :func:`serialize_single_tensor`; accepts any bytes-like ``data``."""
    dtype_name, shape, data = arr
    dtype = getattr(torch, str(dtype_name), None)
    if not isinstance(dtype, torch.dtype):
        raise DataProtoTypeError(f"deserialize_single_tensor: {dtype_name!r} is not a torch dtype")
    buffer = bytearray(memoryview(data).cast("B"))
    raw = torch.frombuffer(buffer, dtype=torch.uint8) if buffer else torch.empty(0, dtype=torch.uint8)
    expected = int(np.prod(tuple(shape), dtype=np.int64)) * torch.empty((), dtype=dtype).element_size()
    if raw.numel() != expected:
        raise DataProtoError(
            f"deserialize_single_tensor: {raw.numel()} bytes cannot hold a {dtype_name} tensor of shape {tuple(shape)} "
            f"({expected} bytes)"
        )
    return raw.view(dtype).reshape(tuple(shape))


def serialize_tensordict(batch: TensorDict) -> tuple[tuple[int, ...], str | None, dict[str, Any]]:
    """``(batch_size, device, {key: encoding})``; nested tensors as ``(layout, [encodings])``."""
    if not isinstance(batch, TensorDict):
        raise DataProtoTypeError(f"serialize_tensordict expects a TensorDict, got {type(batch).__name__}")
    items: dict[str, Any] = {}
    for key, value in batch.items():
        if not isinstance(value, torch.Tensor):
            raise DataProtoTypeError(f"serialize_tensordict: entry {key!r} is a {type(value).__name__}, not a tensor")
        if value.is_nested:
            items[key] = (
                str(value.layout).removeprefix("torch."),
                [serialize_single_tensor(t) for t in value.unbind()],
            )
        else:
            items[key] = serialize_single_tensor(value)
    device = None if batch.device is None else str(batch.device)
    return tuple(batch.batch_size), device, items


def deserialize_tensordict(arr: Any) -> TensorDict:
    """Inverse of :func:`serialize_tensordict`."""
    batch_size, device, items = arr
    decoded: dict[str, torch.Tensor] = {}
    for key, encoding in items.items():
        if len(encoding) == 3:
            decoded[key] = deserialize_single_tensor(encoding)
        elif len(encoding) == 2:
            layout_name, parts = encoding
            layout = getattr(torch, str(layout_name), None)
            if not isinstance(layout, torch.layout):
                raise DataProtoTypeError(f"deserialize_tensordict: {key!r} has unknown layout {layout_name!r}")
            decoded[key] = torch.nested.as_nested_tensor([deserialize_single_tensor(p) for p in parts], layout=layout)
        else:
            raise DataProtoError(
                f"deserialize_tensordict: entry {key!r} has {len(encoding)} fields; expected 3 (a tensor) or 2 (nested)"
            )
    return TensorDict(decoded, batch_size=batch_size, device=device)
