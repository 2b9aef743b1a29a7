"""Deep equality and the merge rules behind ``union`` and ``concat``.

``union`` needs "is this key's value the same on both sides?" for tensors, numpy arrays
(object arrays that may hold NaN, dicts, or even themselves) and meta values; ``concat``
needs the meta merge with its special ``metrics`` key.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict

from hybridflow.fields import META_METRICS
from hybridflow.protocol.errors import DataProtoError, DataProtoTypeError

METRICS_KEY = META_METRICS  # verl merges this meta_info key across concatenated batches


def deep_equal(a: Any, b: Any, _active: set[tuple[int, int]] | None = None) -> bool:
    """Structural equality where NaN equals NaN in the same place.

    Recurses into ndarrays (object arrays element-wise), tensors, dicts, lists and tuples.
    A pair already being compared higher up the stack counts as equal, so containers that
    hold themselves (``arr[0] = arr``) terminate instead of recursing forever.
    """
    if a is b:
        return True
    active = set() if _active is None else _active
    pair = (id(a), id(b))
    if pair in active:
        return True
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return _arrays_equal(a, b, active, pair)
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return _tensors_equal(a, b)
    if _is_nan(a) and _is_nan(b):
        return True
    if isinstance(a, dict) and isinstance(b, dict):
        if a.keys() != b.keys():
            return False
        return _recurse(active, pair, ((a[k], b[k]) for k in a))
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        if type(a) is not type(b) or len(a) != len(b):
            return False
        return _recurse(active, pair, zip(a, b))
    try:
        return bool(a == b)
    except (TypeError, ValueError):  # e.g. objects whose == returns something not boolable
        return False


def _is_nan(x: Any) -> bool:
    # np.float32 is not a Python float subclass, so check both
    return isinstance(x, float | np.floating) and math.isnan(x)


def _recurse(active: set[tuple[int, int]], pair: tuple[int, int], items: Any) -> bool:
    active.add(pair)
    try:
        return all(deep_equal(x, y, active) for x, y in items)
    finally:
        active.discard(pair)


def _arrays_equal(a: Any, b: Any, active: set[tuple[int, int]], pair: tuple[int, int]) -> bool:
    if not (isinstance(a, np.ndarray) and isinstance(b, np.ndarray)) or a.shape != b.shape:
        return False
    if a.dtype == object or b.dtype == object:
        return _recurse(active, pair, zip(a.ravel(), b.ravel()))
    nan_aware = np.issubdtype(a.dtype, np.inexact) and np.issubdtype(b.dtype, np.inexact)
    return bool(np.array_equal(a, b, equal_nan=nan_aware))


def _tensors_equal(a: Any, b: Any) -> bool:
    if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)) or a.shape != b.shape:
        return False
    if a.is_floating_point() and b.is_floating_point():
        both_nan = torch.isnan(a) & torch.isnan(b)
        return bool(((a == b) | both_nan).all())
    return torch.equal(a, b)


def union_two_dict(dict1: dict, dict2: dict) -> dict:
    """Add ``dict2``'s items to ``dict1`` (in place); a shared key must hold equal values."""
    for key, value in dict2.items():
        if key in dict1 and not deep_equal(dict1[key], value):
            raise DataProtoError(f"union: key {key!r} has different values: {dict1[key]!r} vs {value!r}")
        dict1[key] = value
    return dict1


def union_tensor_dict(tensor_dict1: TensorDict, tensor_dict2: TensorDict) -> TensorDict:
    """Add ``tensor_dict2``'s entries to ``tensor_dict1`` (in place) and return it.

    Batch sizes must match; a key present in both must hold ``torch.equal`` tensors.
    """
    if tensor_dict1.batch_size != tensor_dict2.batch_size:
        raise DataProtoError(
            f"union: batch sizes differ: {tuple(tensor_dict1.batch_size)} vs {tuple(tensor_dict2.batch_size)}"
        )
    for key in tensor_dict2.keys():
        value = tensor_dict2[key]
        if key in tensor_dict1.keys() and not torch.equal(tensor_dict1[key], value):
            raise DataProtoError(f"union: tensor {key!r} differs between the two batches")
        tensor_dict1[key] = value
    return tensor_dict1


def union_numpy_dict(tensor_dict1: dict[str, np.ndarray], tensor_dict2: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Add ``tensor_dict2``'s arrays to ``tensor_dict1`` (in place) and return it.

    A key present in both must hold deep-equal arrays (NaN equal to NaN in the same place,
    object arrays compared element by element).
    """
    for key, value in tensor_dict2.items():
        if key in tensor_dict1:
            for side, array in (("first", tensor_dict1[key]), ("second", value)):
                if not isinstance(array, np.ndarray):
                    raise DataProtoTypeError(
                        f"union: non-tensor {key!r} of the {side} dict is a {type(array).__name__}, not an ndarray"
                    )
            if not deep_equal(tensor_dict1[key], value):
                raise DataProtoError(f"union: non-tensor {key!r} differs between the two batches")
        tensor_dict1[key] = value
    return tensor_dict1


def list_of_dict_to_dict_of_list(list_of_dict: Sequence[dict]) -> dict[str, list]:
    """``[{"a": 1, "b": 2}, {"a": 3}]`` → ``{"a": [1, 3], "b": [2]}`` (keys in first-seen order).

    A key missing from some dicts gets only the values of the dicts that have it.
    """
    output: dict[str, list] = {}
    for item in list_of_dict:
        if not isinstance(item, dict):
            raise DataProtoTypeError(f"list_of_dict_to_dict_of_list expects dicts, got {type(item).__name__}")
        for key, value in item.items():
            output.setdefault(key, []).append(value)
    return output


def merge_meta_info(metas: list[dict[str, Any]]) -> dict[str, Any]:
    """Union of the parts' meta; ``metrics`` (dict or list of dicts) become one dict of lists."""
    merged: dict[str, Any] = {}
    metrics: list[dict] = []
    for meta in metas:
        for key, value in meta.items():
            if key == METRICS_KEY:
                if value is not None:
                    metrics.extend(value if isinstance(value, list) else [value])
            elif key in merged and not deep_equal(merged[key], value):
                raise DataProtoError(f"Conflicting values for meta_info key '{key}': {merged[key]!r} vs {value!r}")
            else:
                merged[key] = value
    if metrics:
        merged[METRICS_KEY] = list_of_dict_to_dict_of_list(metrics)
    return merged


def check_same_keys(part: str, key_lists: list[list[str]]) -> None:
    for i, keys in enumerate(key_lists[1:], start=1):
        if keys != key_lists[0]:
            raise DataProtoError(f"DataProto.concat: {part} keys of part {i} {keys} differ from part 0 {key_lists[0]}")
