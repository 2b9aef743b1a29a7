"""``DataProto``: the container every worker-group call sends and returns.

A ``DataProto`` holds ``B`` rows in three parts:

* ``batch`` — a :class:`tensordict.TensorDict` of per-row tensors, batch size ``(B,)``;
* ``non_tensor_batch`` — ``{name: np.ndarray}`` of per-row values (object dtype allowed),
  each with first dimension ``B``;
* ``meta_info`` — ``{name: value}`` facts about the whole batch (temperature, metrics, ...).

Names and semantics follow verl's ``verl.protocol`` so ported code only changes its import.
The class keeps verl's methods; the work behind some of them lives beside it, one job a module:
``consistency.py`` (the parts agree), ``key_ops.py`` (select, pop, rename), ``combine.py``
(union, concat), ``splitting.py`` (chunk bounds, iteration settings), ``describe.py`` (sizes,
summary).
"""

from __future__ import annotations

import pickle
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, overload

import numpy as np
import torch
from tensordict import TensorDict

from hybridflow.protocol.combine import concat_parts, union_parts
from hybridflow.protocol.consistency import check_parts
from hybridflow.protocol.describe import data_info, size_message
from hybridflow.protocol.errors import DataProtoError, DataProtoTypeError
from hybridflow.protocol.key_ops import pop_parts, rename_keys, select_parts
from hybridflow.protocol.rows import (
    IndexLike,
    as_object_column,
    as_row_index,
    check_positive_int,
    common_batch_shape,
    is_scalar_index,
    unfold_or_repeat,
)
from hybridflow.protocol.splitting import chunk_bounds, iteration_settings
from hybridflow.protocol.tensordict_io import pack_tensordict, unpack_tensordict

# verl's key, kept so batches (and their padding flag) move between the two frameworks.
AUTO_PADDING_KEY = "_verl_auto_padding"


@dataclass(eq=False)
class DataProtoItem:
    """One row: ``batch`` has batch size ``()``; non-tensor values are the row's elements."""

    batch: TensorDict | None = None
    non_tensor_batch: dict[str, Any] = field(default_factory=dict)
    meta_info: dict[str, Any] = field(default_factory=dict)


@dataclass(eq=False)
class DataProto:
    """Rows of tensors (``batch``), rows of numpy values (``non_tensor_batch``) and batch facts.

    ``len()`` is the batch size, else the length of any non-tensor array, else 0.
    Construction checks that every part agrees on the number of rows.
    """

    batch: TensorDict | None = None
    non_tensor_batch: dict[str, np.ndarray] = field(default_factory=dict)
    meta_info: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.non_tensor_batch is None:
            self.non_tensor_batch = {}
        if self.meta_info is None:
            self.meta_info = {}
        self.check_consistency()

    def check_consistency(self) -> None:
        """Raise if the parts disagree: one batch dim when there are non-tensors, equal lengths."""
        check_parts(self.batch, self.non_tensor_batch, self.meta_info)

    def __len__(self) -> int:
        if self.batch is not None:
            return int(self.batch.batch_size[0])
        for value in self.non_tensor_batch.values():
            return int(value.shape[0])
        return 0

    @overload
    def __getitem__(self, item: int | np.integer) -> DataProtoItem: ...

    @overload
    def __getitem__(self, item: slice) -> DataProto: ...

    @overload
    def __getitem__(self, item: IndexLike) -> DataProto | DataProtoItem: ...

    def __getitem__(self, item: int | np.integer | slice | IndexLike) -> DataProto | DataProtoItem:
        """slice → :meth:`slice`; list/ndarray/tensor → :meth:`select_idxs`; int → one row."""
        if isinstance(item, slice):
            return self.slice(item.start, item.stop, item.step)
        if isinstance(item, list | np.ndarray | torch.Tensor) and not is_scalar_index(item):
            return self.select_idxs(item)
        if isinstance(item, bool) or not isinstance(item, int | np.integer | torch.Tensor | np.ndarray):
            raise DataProtoTypeError(
                f"DataProto indices must be int, slice, list, ndarray or tensor, got {type(item).__name__}"
            )
        row = int(item)
        if not -len(self) <= row < len(self):
            raise IndexError(f"row {row} out of range for a DataProto of {len(self)} rows")
        batch = None if self.batch is None else self.batch[row]
        non_tensors = {key: value[row] for key, value in self.non_tensor_batch.items()}
        return DataProtoItem(batch=batch, non_tensor_batch=non_tensors, meta_info=self.meta_info)

    def __iter__(self) -> Iterator[DataProtoItem]:
        for row in range(len(self)):
            yield self[row]

    def require_batch(self) -> TensorDict:
        """``batch``, for code that needs the tensors; raises if this DataProto has none.

        ``batch`` is ``None`` (as in verl) when a DataProto holds only non-tensors and meta.
        """
        if self.batch is None:
            raise DataProtoError("this DataProto has no tensor batch (batch is None): it holds only non-tensors/meta")
        return self.batch

    # --- pickling: a plain dict of tensors survives any tensordict version -------------------

    def __getstate__(self) -> dict[str, Any]:
        batch = None
        if self.batch is not None:
            device = None if self.batch.device is None else str(self.batch.device)
            batch = {"tensors": dict(self.batch.items()), "batch_size": tuple(self.batch.batch_size), "device": device}
        return {"batch": batch, "non_tensor_batch": self.non_tensor_batch, "meta_info": self.meta_info}

    def __setstate__(self, state: dict[str, Any]) -> None:
        packed = state["batch"]
        self.batch = None
        if packed is not None:
            self.batch = TensorDict(packed["tensors"], batch_size=packed["batch_size"], device=packed["device"])
        self.non_tensor_batch = state["non_tensor_batch"]
        self.meta_info = state["meta_info"]

    def save_to_disk(self, filepath: str) -> None:
        with open(filepath, "wb") as f:
            pickle.dump(self, f)

    @staticmethod
    def load_from_disk(filepath: str) -> DataProto:
        with open(filepath, "rb") as f:
            data = pickle.load(f)
        if not isinstance(data, DataProto):
            raise DataProtoTypeError(f"{filepath} holds a {type(data).__name__}, not a DataProto")
        return data

    # --- construction ---------------------------------------------------------------------

    @classmethod
    def from_dict(
        cls,
        tensors: dict[str, torch.Tensor] | None = None,
        non_tensors: dict[str, Any] | None = None,
        meta_info: dict[str, Any] | None = None,
        num_batch_dims: int = 1,
        auto_padding: bool = False,
    ) -> DataProto:
        """Build from dicts; the batch size is the first ``num_batch_dims`` dims of the tensors.

        Non-tensor values that are not ndarrays (lists) become 1-D object arrays.
        ``auto_padding=True`` sets the padding flag in ``meta_info``.
        """
        check_positive_int("num_batch_dims", num_batch_dims)
        tensors = {} if tensors is None else tensors
        meta_info = {} if meta_info is None else dict(meta_info)
        batch_size = common_batch_shape(tensors, num_batch_dims)
        arrays = {key: as_object_column(key, value) for key, value in (non_tensors or {}).items()}
        batch = TensorDict(dict(tensors), batch_size=batch_size) if tensors else None
        if auto_padding:
            meta_info[AUTO_PADDING_KEY] = True
        return cls(batch=batch, non_tensor_batch=arrays, meta_info=meta_info)

    @classmethod
    def from_single_dict(
        cls,
        data: dict[str, torch.Tensor | np.ndarray],
        meta_info: dict[str, Any] | None = None,
        auto_padding: bool = False,
    ) -> DataProto:
        """Split a flat dict into tensors and ndarrays; any other value type raises."""
        tensors, non_tensors = {}, {}
        for key, value in data.items():
            if isinstance(value, torch.Tensor):
                tensors[key] = value
            elif isinstance(value, np.ndarray):
                non_tensors[key] = value
            else:
                raise DataProtoError(
                    f"from_single_dict: {key!r} is a {type(value).__name__}; expected a torch.Tensor or np.ndarray"
                )
        return cls.from_dict(tensors=tensors, non_tensors=non_tensors, meta_info=meta_info, auto_padding=auto_padding)

    def to_tensordict(self) -> TensorDict:
        """One TensorDict: tensors as they are, non-tensors as NonTensorStack, meta as NonTensorData."""
        return pack_tensordict(self.batch, self.non_tensor_batch, self.meta_info, len(self))

    @classmethod
    def from_tensordict(
        cls, tensor_dict: TensorDict, meta_info: dict[str, Any] | None = None, num_batch_dims: int = 1
    ) -> DataProto:
        """Inverse of :meth:`to_tensordict`; non-tensor columns come back as 1-D object arrays.

        ``meta_info`` entries are added to the meta found in the TensorDict.
        """
        batch, non_tensors, meta = unpack_tensordict(tensor_dict, num_batch_dims)
        return cls(batch=batch, non_tensor_batch=non_tensors, meta_info={**meta, **(meta_info or {})})

    def to(self, device: str | torch.device) -> DataProto:
        """Move the tensors to ``device`` (in place) and return self."""
        if self.batch is not None:
            self.batch = self.batch.to(device)
        return self

    # --- selecting rows and keys -------------------------------------------------------------

    def select(
        self,
        batch_keys: Sequence[str] | None = None,
        non_tensor_batch_keys: Sequence[str] | None = None,
        meta_info_keys: Sequence[str] | None = None,
        deepcopy: bool = False,
    ) -> DataProto:
        """Keep the named keys (``None`` keeps all of that part).

        Batch keys must exist; absent non-tensor / meta keys are skipped (as in verl).
        ``deepcopy=True`` copies tensors and values instead of sharing them.
        """
        batch, non_tensors, meta = select_parts(
            (self.batch, self.non_tensor_batch, self.meta_info),
            (batch_keys, non_tensor_batch_keys, meta_info_keys),
            deepcopy,
        )
        return type(self)(batch=batch, non_tensor_batch=non_tensors, meta_info=meta)

    def select_idxs(self, idxs: IndexLike) -> DataProto:
        """Rows picked by integer positions or a boolean mask (list, ndarray or tensor)."""
        index_t, index_np = as_row_index(idxs, len(self))
        batch = None
        if self.batch is not None:
            index_t = index_t.to(self.batch.device) if self.batch.device is not None else index_t
            batch = TensorDict(
                {key: value[index_t] for key, value in self.batch.items()},
                batch_size=[int(index_np.shape[0])],
                device=self.batch.device,
            )
        non_tensors = {key: value[index_np] for key, value in self.non_tensor_batch.items()}
        return type(self)(batch=batch, non_tensor_batch=non_tensors, meta_info=dict(self.meta_info))

    def slice(self, start: int | None = None, end: int | None = None, step: int | None = None) -> DataProto:
        """Rows ``start:end:step`` (tensors are views)."""
        rows = slice(start, end, step)
        batch = None
        if self.batch is not None:
            batch = self.batch[rows]
        non_tensors = {key: value[rows] for key, value in self.non_tensor_batch.items()}
        return type(self)(batch=batch, non_tensor_batch=non_tensors, meta_info=dict(self.meta_info))

    def pop(
        self,
        batch_keys: Sequence[str] | None = None,
        non_tensor_batch_keys: Sequence[str] | None = None,
        meta_info_keys: Sequence[str] | None = None,
    ) -> DataProto:
        """Remove the named keys from self (all must exist) and return them as a new DataProto."""
        batch, non_tensors, meta = pop_parts(
            (self.batch, self.non_tensor_batch, self.meta_info), (batch_keys, non_tensor_batch_keys, meta_info_keys)
        )
        return type(self)(batch=batch, non_tensor_batch=non_tensors, meta_info=meta)

    def rename(
        self, old_keys: str | Sequence[str] | None = None, new_keys: str | Sequence[str] | None = None
    ) -> DataProto:
        """Rename batch (or non-tensor) keys in place; returns self."""
        rename_keys(self.batch, self.non_tensor_batch, old_keys, new_keys)
        return self

    # --- combining ----------------------------------------------------------------------------

    def union(self, other: DataProto) -> DataProto:
        """Merge ``other`` into self (in place) and return self.

        Lengths must match; a key in both must hold equal values (tensors ``torch.equal``,
        arrays deep-equal with NaN == NaN, meta ``==``), else ``ValueError`` naming the key.
        """
        self.batch, self.non_tensor_batch, self.meta_info = union_parts(self, other)
        self.check_consistency()
        return self

    @staticmethod
    def concat(data: Sequence[DataProto]) -> DataProto:
        """Rows of all parts in order; returns the first part's class.

        meta: ``metrics`` (a dict or list of dicts per part, may be absent) are merged into
        one dict of lists; other keys must agree across parts.
        """
        batch, non_tensors, meta = concat_parts(data)
        return type(data[0])(batch=batch, non_tensor_batch=non_tensors, meta_info=meta)

    # --- splitting ----------------------------------------------------------------------------

    def chunk(self, chunks: int) -> list[DataProto]:
        """``chunks`` consecutive parts of equal size sharing the meta.

        Not divisible → error (an ``AssertionError`` too, as in verl), unless auto-padding is
        on: then, as verl (``torch.chunk``), every part but the last has ⌈rows / chunks⌉ rows
        — 10 rows in 4 chunks are 3, 3, 3, 1. Where that leaves fewer than ``chunks`` parts
        (6 rows in 4 chunks: 2, 2, 2) it is an error, where verl fails with an IndexError.
        """
        check_positive_int("chunks", chunks)
        starts, size = chunk_bounds(len(self), chunks, self.is_padding_enabled())
        return [self.slice(start, start + size) for start in starts]

    def split(self, split_size: int) -> list[DataProto]:
        """Consecutive parts of ``split_size`` rows; the last may be shorter."""
        check_positive_int("split_size", split_size)
        return [self.slice(start, start + split_size) for start in range(0, len(self), split_size)]

    # --- repeating and reordering -------------------------------------------------------------

    def repeat(self, repeat_times: int = 2, interleave: bool = True) -> DataProto:
        """Each row ``repeat_times`` times: interleave → a,a,b,b; else a,b,a,b."""
        check_positive_int("repeat_times", repeat_times)
        rows = np.arange(len(self))
        index = np.repeat(rows, repeat_times) if interleave else np.tile(rows, repeat_times)
        return self.select_idxs(index)

    def sample_level_repeat(self, repeat_times: Sequence[int] | np.ndarray | torch.Tensor) -> DataProto:
        """Row i repeated ``repeat_times[i]`` times (0 drops it), rows kept in order."""
        if isinstance(repeat_times, torch.Tensor):
            repeat_times = repeat_times.detach().cpu().numpy()
        counts = np.asarray(repeat_times).reshape(-1)
        if counts.shape[0] != len(self):
            raise DataProtoError(f"sample_level_repeat: {counts.shape[0]} counts for {len(self)} rows")
        if counts.size and (not np.issubdtype(counts.dtype, np.integer) or counts.min() < 0):
            raise DataProtoError(f"sample_level_repeat: counts must be non-negative ints, got {counts.tolist()}")
        return self.select_idxs(np.repeat(np.arange(len(self)), counts.astype(np.int64)))

    def reorder(self, indices: IndexLike) -> None:
        """Rearrange rows in place: row j becomes old row ``indices[j]``."""
        reordered = self.select_idxs(indices)
        self.batch, self.non_tensor_batch = reordered.batch, reordered.non_tensor_batch

    def unfold_column_chunks(self, n_split: int, split_keys: Sequence[str] | None = None) -> DataProto:
        """Cut dim 1 of each ``split_keys`` entry into ``n_split`` pieces moved into the batch dim.

        A split key of shape ``(B, n_split·k, ...)`` becomes ``(B·n_split, k, ...)``; every other
        key is repeated (interleaved) ``n_split`` times so rows stay aligned.
        """
        check_positive_int("n_split", n_split)
        to_split = set(split_keys or [])
        batch = None
        if self.batch is not None:
            columns = {k: unfold_or_repeat(k, v, n_split, k in to_split) for k, v in self.batch.items()}
            batch = TensorDict(columns, batch_size=[len(self) * n_split], device=self.batch.device)
        non_tensors = {k: unfold_or_repeat(k, v, n_split, k in to_split) for k, v in self.non_tensor_batch.items()}
        return type(self)(batch=batch, non_tensor_batch=non_tensors, meta_info=dict(self.meta_info))

    # --- padding ------------------------------------------------------------------------------

    def padding(self, padding_size: int, padding_candidate: str = "") -> None:
        """Append ``padding_size`` copies of the first (``"first"``) or last row, in place."""
        if padding_candidate not in ("", "first", "last"):
            raise DataProtoError(f"padding_candidate must be 'first', 'last' or '', got {padding_candidate!r}")
        if padding_size < 0:
            raise DataProtoError(f"padding_size must be >= 0, got {padding_size}")
        if padding_size == 0:
            return
        if len(self) == 0:
            raise DataProtoError("cannot pad an empty DataProto: there is no row to copy")
        row = 0 if padding_candidate == "first" else len(self) - 1
        padded = self.select_idxs(np.concatenate([np.arange(len(self)), np.full(padding_size, row)]))
        self.batch, self.non_tensor_batch = padded.batch, padded.non_tensor_batch

    def is_padding_enabled(self) -> bool:
        """True when this DataProto was built with ``auto_padding=True``."""
        return bool(self.meta_info.get(AUTO_PADDING_KEY, False))

    # --- iteration ---------------------------------------------------------------------------

    def make_iterator(
        self,
        mini_batch_size: int,
        epochs: int,
        seed: int | None = None,
        dataloader_kwargs: dict[str, Any] | None = None,
    ) -> Iterator[DataProto]:
        """Mini-batches of ``mini_batch_size`` rows for ``epochs`` passes; each carries the meta.

        ``dataloader_kwargs={"shuffle": True}`` draws a fresh permutation per epoch from a
        generator seeded with ``seed`` (same seed → identical mini-batches).
        """
        check_positive_int("mini_batch_size", mini_batch_size)
        shuffle, generator = iteration_settings(len(self), mini_batch_size, seed, dataloader_kwargs)
        return self._iterate(mini_batch_size, epochs, shuffle, generator)

    def _iterate(self, size: int, epochs: int, shuffle: bool, generator: torch.Generator | None) -> Iterator[DataProto]:
        for _ in range(epochs):
            order = torch.randperm(len(self), generator=generator) if shuffle else torch.arange(len(self))
            for start in range(0, len(self), size):
                mini_batch = self.select_idxs(order[start : start + size])
                mini_batch.meta_info = self.meta_info
                yield mini_batch

    # --- introspection -----------------------------------------------------------------------

    def print_size(self, prefix: str = "") -> str:
        """Print (and return) the memory of the tensors and of the numpy arrays in GB."""
        message = size_message(self.batch, self.non_tensor_batch)
        if prefix:
            message = f"{prefix}, {message}"
        print(message)
        return message

    def get_data_info(self) -> str:
        """A multi-line summary: each key with its shape and dtype, meta keys with their types."""
        return data_info(len(self), self.batch, self.non_tensor_batch, self.meta_info)
