"""KVCache.joined: two caches become one, right-aligned, with the padding zeroed and masked."""

from __future__ import annotations

import torch

from hybridflow.inference.kv_cache import KVCache


def _cache(rows: int, length: int, max_len: int, start: float) -> KVCache:
    cache = KVCache(num_layers=2, rows=rows, kv_heads=1, max_len=max_len, head_dim=2, dtype=torch.float32,
                    device=torch.device("cpu"))
    cache.data[:, :, :, :, :length] = torch.arange(2 * 2 * rows * length * 2, dtype=torch.float32).view(
        2, 2, rows, 1, length, 2) + start
    cache.key_pos[:, :length] = torch.arange(length) + 10
    cache.key_valid[:, :length] = True
    cache.length = length
    return cache


def test_joined_right_aligns_both_caches_and_masks_the_left_padding():
    running = _cache(rows=2, length=3, max_len=6, start=0.0)
    running.key_valid[0, 0] = False  # row 0 had one column of left padding
    running.data[:, :, :, :, 3:] = float("nan")  # columns past the written length must not travel
    new = _cache(rows=1, length=5, max_len=5, start=1000.0)
    out = running.joined(new, extra_columns=4)

    assert (out.rows, out.max_len, out.length) == (3, 9, 5)
    assert torch.equal(out.data[:, :, :2, :, 2:5], running.data[:, :, :, :, :3])
    assert torch.equal(out.data[:, :, 2:, :, :5], new.data[:, :, :, :, :5])
    assert torch.equal(out.data[:, :, :2, :, :2], torch.zeros(2, 2, 2, 1, 2, 2))  # zeros, not garbage
    assert out.key_valid.tolist() == [
        [False, False, False, True, True] + [True] * 4,
        [False, False, True, True, True] + [True] * 4,
        [True] * 9,
    ]
    assert out.key_pos[:, :5].tolist() == [[0, 0, 10, 11, 12], [0, 0, 10, 11, 12], [10, 11, 12, 13, 14]]
    assert not out.no_padding


def test_joined_caches_of_equal_length_have_no_padding():
    out = _cache(rows=1, length=4, max_len=8, start=0.0).joined(_cache(rows=2, length=4, max_len=4, start=5.0), 2)
    assert (out.rows, out.max_len, out.length) == (3, 6, 4) and out.no_padding
