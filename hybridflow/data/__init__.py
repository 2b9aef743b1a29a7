"""Data: the RL prompt dataset, its resumable loader, row files and built-in tasks.

``RLDataset(files, tokenizer, ...)`` → ``StatefulDataLoader(dataset, batch_size, seed=...)``
→ dicts for ``DataProto.from_single_dict``. Tasks: ``hybridflow.data.tasks`` /
``hybridflow data`` (:mod:`hybridflow.entrypoints.data`).
"""

from __future__ import annotations

from hybridflow.data.collate import collate_fn
from hybridflow.data.io import DataFileError, read_rows, write_rows
from hybridflow.data.rl_dataset import (
    TRUNCATION_MODES,
    RLDataset,
    left_pad,
    truncate_ids,
)
from hybridflow.data.sampler import StatefulDataLoader, StatefulSampler
from hybridflow.data.schema import DataRowError, RLRow, validate_rl_row

__all__ = [
    "TRUNCATION_MODES",
    "DataFileError",
    "DataRowError",
    "RLDataset",
    "RLRow",
    "StatefulDataLoader",
    "StatefulSampler",
    "collate_fn",
    "left_pad",
    "read_rows",
    "truncate_ids",
    "validate_rl_row",
    "write_rows",
]
