"""``trainer.balance_batch``: reorder rows so every data-parallel rank gets a similar token count.

DP dispatch hands rank r the r-th of ``dp_size`` equal consecutive chunks of the batch. Rows
differ a lot in length (prompt + response tokens), so plain chunks can leave one rank with far
more work than the others, and every rank waits for the slowest. :func:`balanced_order` finds a
permutation whose consecutive chunks have (nearly) equal token sums and exactly
``len / dp_size`` rows each; :func:`balance_batch` applies it to a batch in place.

Method: the longest-processing-time greedy rule with equal chunk sizes — rows from longest
to shortest (ties: lower index first), each to the chunk with the smallest token sum that still
has room (ties: lower chunk). Inside a chunk rows keep their batch order. Balancing only moves
rows between ranks: advantages are computed before it and each update normalises with global
counts, so what is learned does not change.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from hybridflow import fields as FK
from hybridflow.protocol import DataProto


def balanced_order(lengths: Sequence[int], dp_size: int) -> list[int]:
    """Row indices in the order that gives ``dp_size`` consecutive chunks of equal row count and
    nearly equal Σ length. ``len(lengths)`` must be a multiple of ``dp_size``."""
    n = len(lengths)
    if dp_size < 1:
        raise ValueError(f"dp_size must be >= 1, got {dp_size}")
    if n % dp_size:
        raise ValueError(f"cannot balance {n} rows over {dp_size} ranks: the row count must be a multiple of it")
    per_chunk = n // dp_size
    chunks: list[list[int]] = [[] for _ in range(dp_size)]
    sums = [0] * dp_size
    for i in sorted(range(n), key=lambda i: (-int(lengths[i]), i)):
        open_chunks = [c for c in range(dp_size) if len(chunks[c]) < per_chunk]
        target = min(open_chunks, key=lambda c: (sums[c], c))
        chunks[target].append(i)
        sums[target] += int(lengths[i])
    return [i for chunk in chunks for i in sorted(chunk)]


def chunk_token_sums(lengths: Sequence[int], order: Sequence[int], dp_size: int) -> list[int]:
    """Σ length of each of the ``dp_size`` consecutive chunks of ``order``."""
    per_chunk = len(order) // dp_size
    return [sum(int(lengths[i]) for i in order[c * per_chunk : (c + 1) * per_chunk]) for c in range(dp_size)]


def balance_batch(data: DataProto, dp_size: int, metric_prefix: str = "global_seqlen") -> dict[str, float]:
    """Reorder ``data`` in place so DP chunks hold similar token counts (``attention_mask`` sums).

    Returns verl's balance metrics: ``{prefix}/min``, ``/max``, ``/minmax_diff`` (per-rank
    token sums before), ``/balanced_min``, ``/balanced_max`` (after) and ``/mean``.
    """
    if data.batch is None or FK.ATTENTION_MASK not in data.batch.keys():
        raise KeyError(f"balance_batch needs batch[{FK.ATTENTION_MASK!r}]")
    lengths = data.batch[FK.ATTENTION_MASK].sum(dim=-1).tolist()
    order = balanced_order(lengths, dp_size)
    before = chunk_token_sums(lengths, range(len(lengths)), dp_size)
    after = chunk_token_sums(lengths, order, dp_size)
    data.reorder(torch.tensor(order, dtype=torch.long))
    return {
        f"{metric_prefix}/min": float(min(before)),
        f"{metric_prefix}/max": float(max(before)),
        f"{metric_prefix}/minmax_diff": float(max(before) - min(before)),
        f"{metric_prefix}/balanced_min": float(min(after)),
        f"{metric_prefix}/balanced_max": float(max(after)),
        f"{metric_prefix}/mean": float(sum(before) / dp_size),
    }
