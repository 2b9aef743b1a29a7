"""Group ids: rows sampled from the same prompt share an ``index`` (the ``uid`` column).

``index`` arrives as a numpy object array of strings, a list, or a tensor; the helpers turn it
into dense integer ids 0..G−1 in order of first appearance, plus per-group row lists.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any, Protocol

import torch


class ArrayLike(Protocol):
    """A numpy array, typed without importing numpy here: anything with ``tolist()``."""

    def tolist(self) -> Any: ...


GroupIndex = Sequence[Hashable] | torch.Tensor | ArrayLike


def index_keys(index: object) -> list[Hashable]:
    """The group keys as a plain list (tensor, numpy array or sequence input)."""
    if isinstance(index, torch.Tensor):
        return index.reshape(-1).tolist()
    # numpy arrays (object or numeric) expose tolist(); avoids importing numpy in algorithms.
    tolist = getattr(index, "tolist", None)
    keys = tolist() if callable(tolist) else list(index)  # type: ignore[call-overload]
    return list(keys)


def group_ids(index: GroupIndex, batch_size: int, device: torch.device | None = None) -> tuple[torch.Tensor, int]:
    """Dense group ids (B,) int64 in first-appearance order, and the number of groups G."""
    keys = index_keys(index)
    if len(keys) != batch_size:
        raise ValueError(f"index has {len(keys)} entries but the batch has {batch_size} rows")
    dense: dict[Hashable, int] = {}
    ids = [dense.setdefault(key, len(dense)) for key in keys]
    return torch.tensor(ids, dtype=torch.long, device=device), len(dense)


def group_rows(index: GroupIndex, batch_size: int) -> list[list[int]]:
    """Row indices of each group, groups in first-appearance order, rows ascending."""
    ids, num_groups = group_ids(index, batch_size)
    rows: list[list[int]] = [[] for _ in range(num_groups)]
    for row, gid in enumerate(ids.tolist()):
        rows[gid].append(row)
    return rows


def group_sizes(gidx: torch.Tensor, num_groups: int, dtype: torch.dtype) -> torch.Tensor:
    """Size of each row's group, (B,), in ``dtype``."""
    counts = torch.bincount(gidx, minlength=num_groups).to(dtype)
    return counts[gidx]
