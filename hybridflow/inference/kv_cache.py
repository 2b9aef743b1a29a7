"""A preallocated key/value cache whose rows can be dropped or repeated between steps.

Layout: one tensor ``(num_layers, 2, rows, kv_heads, max_len, head_dim)`` (index 0 keys,
1 values) plus ``key_valid (rows, max_len)`` marking which columns hold real tokens (left
padding of the prompt is ``False``) and ``key_pos (rows, max_len)``, the position of each
column's token (a sliding-window layer compares it with the query's position: a shared prefix
makes columns and positions differ). All rows share the column of the current step, so a
decode step writes one column for every row with a single strided copy.
"""

from __future__ import annotations

import torch


class KVCache:
    """Keys/values of every layer for a batch of sequences, ``max_len`` columns each."""

    def __init__(
        self,
        num_layers: int,
        rows: int,
        kv_heads: int,
        max_len: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        self.data = torch.empty((num_layers, 2, rows, kv_heads, max_len, head_dim), dtype=dtype, device=device)
        self.key_valid = torch.zeros((rows, max_len), dtype=torch.bool, device=device)
        self.key_pos = torch.zeros((rows, max_len), dtype=torch.long, device=device)
        self.no_padding = False  # every written column of every row is a real token
        self.length = 0  # columns written so far (same for every row)

    def set_prompt_mask(self, attention_mask: torch.Tensor) -> None:
        """Mark the prompt columns (left padding = False) and every later column as valid."""
        plen = attention_mask.shape[1]
        self.key_valid[:, :plen] = attention_mask.bool()
        self.key_valid[:, plen:] = True
        self.no_padding = bool(self.key_valid.all())

    @property
    def rows(self) -> int:
        return self.data.shape[2]

    @property
    def max_len(self) -> int:
        return self.data.shape[4]

    def keys(self, layer: int) -> torch.Tensor:
        """(rows, kv_heads, max_len, head_dim) view of one layer's keys."""
        return self.data[layer, 0]

    def values(self, layer: int) -> torch.Tensor:
        return self.data[layer, 1]

    def select_rows(self, index: torch.Tensor) -> None:
        """Keep (or repeat) rows: row i of the new cache is old row ``index[i]``.

        Only the ``length`` written columns are copied, into a fresh buffer sized for the new
        row count, so dropping finished rows frees their memory and compute.
        """
        index = index.to(self.data.device)
        new = self.data.new_empty((*self.data.shape[:2], index.numel(), *self.data.shape[3:]))
        if self.length:
            torch.index_select(self.data[:, :, :, :, : self.length], 2, index, out=new[:, :, :, :, : self.length])
        self.data = new
        self.key_valid = self.key_valid.index_select(0, index)
        self.key_pos = self.key_pos.index_select(0, index)
        self.no_padding = bool(self.key_valid.all())

    def joined(self, other: KVCache, extra_columns: int) -> KVCache:
        """A new cache holding this cache's rows, then ``other``'s, each right-aligned at the
        longer one's written length, with ``extra_columns`` free columns after it.

        Keys carry their RoPE positions and ``key_pos`` / ``key_valid`` move with them, so a
        row's attention is unchanged by the shift; the left-padding columns are zeros marked
        invalid (zeros, not garbage: a NaN there would survive the mask's −inf).
        """
        width = max(self.length, other.length)
        layers, _, _, kv_heads, _, head_dim = self.data.shape
        out = KVCache(
            layers, self.rows + other.rows, kv_heads, width + extra_columns, head_dim, self.data.dtype, self.data.device
        )
        out.data[:, :, :, :, :width].zero_()
        start = 0
        for src in (self, other):
            rows, shift = slice(start, start + src.rows), width - src.length
            out.data[:, :, rows, :, shift:width] = src.data[:, :, :, :, : src.length]
            out.key_valid[rows, shift:width] = src.key_valid[:, : src.length]
            out.key_pos[rows, shift:width] = src.key_pos[:, : src.length]
            start += src.rows
        out.key_valid[:, width:] = True
        out.length = width
        out.no_padding = bool(out.key_valid.all())
        return out

    def prefix_columns(self, row: int, length: int) -> torch.Tensor | None:
        """Keys and values of positions 0 … ``length`` − 1 of ``row``, in order,
        ``(num_layers, 2, kv_heads, length, head_dim)``; None unless the row holds each of those
        positions in exactly one valid column (a finished row's padding columns repeat a later
        position, and a row can start past position 0)."""
        columns = (self.key_valid[row, : self.length] & (self.key_pos[row, : self.length] < length)).nonzero()[:, 0]
        if columns.numel() != length or not torch.equal(
            self.key_pos[row, columns], torch.arange(length, device=self.key_pos.device)
        ):
            return None
        return self.data[:, :, row].index_select(3, columns)

    def window_mask(self, positions: torch.Tensor, window: int, columns: int) -> torch.Tensor:
        """(rows, 1, 1, columns) bool: the first ``columns`` keys that a query at ``positions``
        (rows,) sees through a sliding ``window`` (HF's rule: q − k < window), valid ones only."""
        recent = self.key_pos[:, :columns] > (positions[:, None] - window)
        return (recent & self.key_valid[:, :columns])[:, None, None]

    def nbytes(self) -> int:
        return self.data.numel() * self.data.element_size()
