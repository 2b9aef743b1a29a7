"""Keys across a ``DataProto``'s three parts: keep some (select), take some out (pop), rename.

Each function works on the parts (``batch``, ``non_tensor_batch``, ``meta_info``) and returns
new parts (the keys, too, come as one list per part); the :class:`~hybridflow.protocol.dataproto.DataProto` methods of the same names wrap
them, so the semantics (verl's) are documented there.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import numpy as np
from tensordict import TensorDict

from hybridflow.protocol.errors import DataProtoError, DataProtoKeyError

Parts = tuple[TensorDict | None, dict[str, np.ndarray], dict[str, Any]]  # batch, non_tensor_batch, meta_info
KeyLists = tuple[Sequence[str] | None, Sequence[str] | None, Sequence[str] | None]  # a key list per part


def select_parts(parts: Parts, keys: KeyLists, deepcopy: bool) -> Parts:
    """The named ``keys`` of each part (``None`` keeps all of it); batch keys must exist."""
    batch, non_tensor_batch, meta_info = parts
    batch_keys, non_tensor_batch_keys, meta_info_keys = keys
    selected = batch
    if batch_keys is not None:
        missing = [k for k in batch_keys if batch is None or k not in batch.keys()]
        if missing:
            raise DataProtoKeyError(f"select: batch keys {missing} not in the batch")
        selected = batch.select(*batch_keys) if batch is not None else None
    non_tensors = non_tensor_batch
    if non_tensor_batch_keys is not None:
        non_tensors = {k: v for k, v in non_tensor_batch.items() if k in non_tensor_batch_keys}
    meta = meta_info
    if meta_info_keys is not None:
        meta = {k: v for k, v in meta_info.items() if k in meta_info_keys}
    if deepcopy:
        selected = None if selected is None else selected.clone()
        non_tensors, meta = copy.deepcopy(non_tensors), copy.deepcopy(meta)
    else:
        non_tensors, meta = dict(non_tensors), dict(meta)
    return selected, non_tensors, meta


def pop_parts(parts: Parts, keys: KeyLists) -> Parts:
    """Remove the named ``keys`` from the parts (in place; all must exist) and return them as new parts."""
    batch, non_tensor_batch, meta_info = parts
    batch_keys, non_tensor_batch_keys, meta_info_keys = (list(k or []) for k in keys)
    batch_names = [] if batch is None else list(batch.keys())
    for part, names, present in (
        ("batch", batch_keys, batch_names),
        ("non_tensor_batch", non_tensor_batch_keys, non_tensor_batch),
        ("meta_info", meta_info_keys, meta_info),
    ):
        missing = [k for k in names if k not in present]
        if missing:
            raise DataProtoKeyError(f"pop: keys {missing} not in {part}")
    popped_batch = None
    if batch_keys and batch is not None:  # keys were found above, so there is a batch
        popped = {k: batch.pop(k) for k in batch_keys}
        popped_batch = TensorDict(popped, batch_size=batch.batch_size, device=batch.device)
    non_tensors = {k: non_tensor_batch.pop(k) for k in non_tensor_batch_keys}
    meta = {k: meta_info.pop(k) for k in meta_info_keys}
    return popped_batch, non_tensors, meta


def rename_keys(
    batch: TensorDict | None,
    non_tensor_batch: dict[str, np.ndarray],
    old_keys: str | Sequence[str] | None,
    new_keys: str | Sequence[str] | None,
) -> None:
    """Rename batch (or non-tensor) keys in place."""
    old = [old_keys] if isinstance(old_keys, str) else list(old_keys or [])
    new = [new_keys] if isinstance(new_keys, str) else list(new_keys or [])
    if len(old) != len(new):
        raise DataProtoError(f"rename: {len(old)} old keys but {len(new)} new keys")
    batch_names = [] if batch is None else list(batch.keys())
    for old_key, new_key in zip(old, new):
        if batch is not None and old_key in batch_names:
            batch.rename_key_(old_key, new_key)
            batch_names = list(batch.keys())
        elif old_key in non_tensor_batch:
            non_tensor_batch[new_key] = non_tensor_batch.pop(old_key)
        else:
            raise DataProtoKeyError(f"rename: key {old_key!r} is neither in batch nor in non_tensor_batch")
