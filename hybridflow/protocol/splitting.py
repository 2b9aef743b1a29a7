"""Where a ``DataProto``'s rows are cut: the parts of ``chunk``, the settings of ``make_iterator``."""

from __future__ import annotations

from typing import Any

import torch

from hybridflow.protocol.errors import DataProtoError


def chunk_bounds(rows: int, chunks: int, padding_enabled: bool) -> tuple[list[int], int]:
    """``(starts, size)`` of ``chunks`` parts of ``rows`` rows (see ``DataProto.chunk``)."""
    if rows % chunks != 0 and not padding_enabled:
        raise DataProtoError(
            f"only support equal chunk: a DataProto of {rows} rows cannot be cut into {chunks} chunks "
            "(pad it with pad_dataproto_to_divisor or enable auto_padding)"
        )
    size = -(-rows // chunks) if rows else 0
    starts = list(range(0, rows, size)) if size else [0] * chunks
    if len(starts) != chunks:
        raise DataProtoError(
            f"cannot chunk {rows} rows into {chunks} parts of ⌈{rows}/{chunks}⌉ = {size} rows (as torch.chunk): "
            f"that makes {len(starts)} parts; pad to a multiple of {chunks} first (pad_dataproto_to_divisor)"
        )
    return starts, size


def iteration_settings(
    rows: int, mini_batch_size: int, seed: int | None, dataloader_kwargs: dict[str, Any] | None
) -> tuple[bool, torch.Generator | None]:
    """``(shuffle, generator)`` of ``DataProto.make_iterator``; the arguments checked."""
    if rows % mini_batch_size != 0:
        raise DataProtoError(f"make_iterator: {rows} rows is not a multiple of mini_batch_size={mini_batch_size}")
    kwargs = dict(dataloader_kwargs or {})
    shuffle = bool(kwargs.pop("shuffle", False))
    kwargs.pop("drop_last", None)  # always exact: the length is a multiple of the size
    if kwargs:
        raise DataProtoError(
            f"make_iterator: unsupported dataloader_kwargs {sorted(kwargs)}; supported: shuffle, drop_last"
        )
    generator = None
    if seed is not None:
        generator = torch.Generator().manual_seed(seed)
    return shuffle, generator
