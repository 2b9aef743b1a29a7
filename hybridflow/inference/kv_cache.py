"""A preallocated key/value cache whose rows can be dropped or repeated between steps.

Layout: one tensor ``(num_layers, 2, rows, kv_heads, max_len, head_dim)`` (index 0 keys,
1 values) plus ``key_valid (rows, max_len)`` marking which columns hold real tokens (left
padding of the prompt is ``False``). All rows share the column of the current step, so a
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
        self.no_padding = bool(self.key_valid.all())

    def nbytes(self) -> int:
        return self.data.numel() * self.data.element_size()
