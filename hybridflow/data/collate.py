"""Batch rows from :class:`~hybridflow.data.rl_dataset.RLDataset` into one flat dict.

The result is what ``DataProto.from_single_dict`` takes: tensors stacked along a new first
dimension, every other value in a 1-D numpy object array with one entry per row.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch


def collate_fn(rows: Sequence[dict[str, Any]]) -> dict[str, torch.Tensor | np.ndarray]:
    """``[{k: v}] * B`` → ``{k: stack}``: tensors ``(B, ...)``, others ``np.ndarray`` of dtype object, ``(B,)``.

    Object arrays are filled element by element, so equal-length lists (e.g. chat messages
    or token id lists) stay one Python list per row instead of becoming a 2-D array.
    """
    if not rows:
        raise ValueError("collate_fn got an empty batch")
    keys = list(rows[0])
    for i, row in enumerate(rows):
        if set(row) != set(keys):
            raise ValueError(f"collate_fn: row {i} has keys {sorted(row)}, row 0 has {sorted(keys)}")
    out: dict[str, torch.Tensor | np.ndarray] = {}
    for key in keys:
        values = [row[key] for row in rows]
        if isinstance(values[0], torch.Tensor):
            if not all(isinstance(v, torch.Tensor) for v in values):
                raise TypeError(f"collate_fn: key {key!r} mixes tensors and non-tensors")
            out[key] = torch.stack(values)
        else:
            array = np.empty(len(values), dtype=object)
            for i, value in enumerate(values):
                array[i] = value
            out[key] = array
    return out
