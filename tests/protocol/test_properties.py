"""Hypothesis round trips: chunk∘concat, repeat, fold/unfold, pad∘unpad, tensordict."""

from __future__ import annotations

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hybridflow.protocol import (
    DataProto,
    fold_batch_dim,
    pad_dataproto_to_divisor,
    unfold_batch_dim,
    unpad_dataproto,
)

FAST = settings(max_examples=40, deadline=None)


def _proto(n: int, width: int = 2) -> DataProto:
    rows = torch.arange(n * width, dtype=torch.float32).view(n, width)
    names = np.empty(n, dtype=object)
    for i in range(n):
        names[i] = {"row": i, "tags": [i] * (i % 3)}
    return DataProto.from_dict({"x": rows}, {"meta": names}, {"k": "v"})


def _rows(data: DataProto) -> list:
    return list(zip(data.batch["x"].tolist(), data.non_tensor_batch["meta"].tolist()))


@FAST
@given(chunks=st.integers(1, 6), per_chunk=st.integers(0, 4))
def test_concat_of_chunks_is_identity(chunks, per_chunk):
    data = _proto(chunks * per_chunk)
    parts = data.chunk(chunks)
    assert len(parts) == chunks
    back = DataProto.concat(parts)
    assert _rows(back) == _rows(data)
    assert back.meta_info == data.meta_info


@FAST
@given(n=st.integers(0, 8), times=st.integers(1, 4), interleave=st.booleans())
def test_repeat_matches_definition(n, times, interleave):
    data = _proto(n)
    out = data.repeat(times, interleave=interleave)
    expected = [r for r in _rows(data) for _ in range(times)] if interleave else _rows(data) * times
    assert _rows(out) == expected


@FAST
@given(groups=st.integers(1, 5), per_group=st.integers(1, 4))
def test_fold_then_unfold_is_identity(groups, per_group):
    data = _proto(groups * per_group)
    folded = fold_batch_dim(data, groups)
    assert len(folded) == groups
    assert _rows(unfold_batch_dim(folded, batch_dims=2)) == _rows(data)


@FAST
@given(n=st.integers(1, 12), divisor=st.integers(1, 9))
def test_pad_then_unpad_is_identity(n, divisor):
    data = _proto(n)
    padded, pad_size = pad_dataproto_to_divisor(data, divisor)
    assert len(padded) % divisor == 0 and 0 <= pad_size < divisor
    assert _rows(padded)[n:] == [_rows(data)[i % n] for i in range(pad_size)]
    assert _rows(unpad_dataproto(padded, pad_size)) == _rows(data)


@FAST
@given(n=st.integers(0, 6))
def test_tensordict_round_trip(n):
    data = _proto(n)
    back = DataProto.from_tensordict(data.to_tensordict())
    assert _rows(back) == _rows(data)
    assert back.meta_info == data.meta_info
