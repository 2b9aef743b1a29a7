"""Module helpers: pad/unpad, fold/unfold, union_*, collate_fn, list_of_dict_to_dict_of_list."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from tensordict import TensorDict

from hybridflow import fields as F
from hybridflow.protocol import (
    DataProto,
    collate_fn,
    deep_equal,
    fold_batch_dim,
    list_of_dict_to_dict_of_list,
    pad_dataproto_to_divisor,
    unfold_batch_dim,
    union_numpy_dict,
    union_tensor_dict,
    union_two_dict,
    unpad_dataproto,
)


def _ids(data: DataProto) -> list[int]:
    return data.batch[F.INPUT_IDS][:, 0].tolist()


def test_pad_cyclically_from_start(make_proto):
    padded, pad_size = pad_dataproto_to_divisor(make_proto(3), 7)
    assert pad_size == 4
    assert _ids(padded) == [0, 1, 2, 0, 1, 2, 0]
    assert padded.non_tensor_batch[F.UID].tolist() == ["u0", "u1", "u2", "u0", "u1", "u2", "u0"]
    assert padded.meta_info == {"temperature": 1.0}
    assert padded.batch.batch_size == torch.Size([7])


def test_pad_already_divisible_and_empty(make_proto):
    data = make_proto(4)
    same, pad_size = pad_dataproto_to_divisor(data, 2)
    assert same is data and pad_size == 0
    empty, pad_size = pad_dataproto_to_divisor(make_proto(0), 3)
    assert len(empty) == 0 and pad_size == 0
    with pytest.raises(ValueError, match="size_divisor"):
        pad_dataproto_to_divisor(data, 0)
    with pytest.raises(TypeError, match="DataProto"):
        pad_dataproto_to_divisor([1, 2], 2)


def test_unpad(make_proto):
    padded, pad_size = pad_dataproto_to_divisor(make_proto(5), 4)
    out = unpad_dataproto(padded, pad_size)
    assert _ids(out) == [0, 1, 2, 3, 4]
    assert unpad_dataproto(padded, 0) is padded
    with pytest.raises(ValueError, match="pad_size"):
        unpad_dataproto(padded, 9)


def test_fold_and_unfold_batch_dim(make_proto):
    data = make_proto(6)
    folded = fold_batch_dim(data, new_batch_size=2)
    assert folded.batch.batch_size == torch.Size([2])
    assert folded.batch[F.INPUT_IDS].shape == (2, 3, 3)
    assert folded.batch[F.INPUT_IDS][1, :, 0].tolist() == [3, 4, 5]
    assert folded.non_tensor_batch[F.UID].tolist() == [["u0", "u1", "u2"], ["u3", "u4", "u5"]]
    flat = unfold_batch_dim(folded, batch_dims=2)
    assert _ids(flat) == [0, 1, 2, 3, 4, 5]
    assert flat.non_tensor_batch[F.UID].tolist() == [f"u{i}" for i in range(6)]
    assert flat.batch.batch_size == torch.Size([6])
    with pytest.raises(ValueError, match="do not divide"):
        fold_batch_dim(data, 4)


def test_unfold_batch_dim_mismatch():
    data = DataProto(batch=TensorDict({"a": torch.zeros(2, 3), "b": torch.zeros(2, 4)}, batch_size=[2]))
    with pytest.raises(ValueError, match="same first 2 dims"):
        unfold_batch_dim(data)


def test_union_tensor_dict():
    a = TensorDict({"x": torch.ones(2)}, batch_size=[2])
    b = TensorDict({"x": torch.ones(2), "y": torch.zeros(2)}, batch_size=[2])
    out = union_tensor_dict(a, b)
    assert out is a and set(a.keys()) == {"x", "y"}
    with pytest.raises(ValueError, match="'x'"):
        union_tensor_dict(a, TensorDict({"x": torch.zeros(2)}, batch_size=[2]))
    with pytest.raises(ValueError, match="batch sizes"):
        union_tensor_dict(a, TensorDict({}, batch_size=[3]))


def test_union_numpy_dict():
    a = {"n": np.array([1.0, np.nan])}
    out = union_numpy_dict(a, {"n": np.array([1.0, np.nan]), "m": np.array(["s"])})
    assert out is a and set(a) == {"n", "m"}
    with pytest.raises(ValueError, match="'n'"):
        union_numpy_dict(a, {"n": np.array([1.0, 2.0])})
    with pytest.raises(TypeError, match="'n'.*list"):
        union_numpy_dict(a, {"n": [1.0, np.nan]})


def test_union_two_dict():
    assert union_two_dict({"a": 1}, {"a": 1, "b": 2}) == {"a": 1, "b": 2}
    with pytest.raises(ValueError, match="'a'"):
        union_two_dict({"a": 1}, {"a": 2})


def test_deep_equal_cases():
    nan = float("nan")
    assert deep_equal({"a": [1, nan]}, {"a": [1, nan]})
    assert not deep_equal({"a": [1, nan]}, {"a": [nan, 1]})
    assert deep_equal(torch.tensor([1.0, nan]), torch.tensor([1.0, nan]))
    assert not deep_equal(torch.tensor([1.0]), torch.tensor([1.0, 1.0]))
    assert not deep_equal(np.array([1, 2]), np.array([[1, 2]]))
    assert deep_equal(np.float32("nan"), float("nan"))
    assert not deep_equal((1, 2), [1, 2])
    assert not deep_equal(np.array([1]), [1])
    nested = np.empty(1, dtype=object)
    nested[0] = np.array([nan, 2.0])
    twin = np.empty(1, dtype=object)
    twin[0] = np.array([nan, 2.0])
    assert deep_equal(nested, twin)


def test_deep_equal_mutually_referencing():
    a, b = [], []
    a.append(a)
    b.append(b)
    assert deep_equal(a, b)


def test_collate_fn(make_proto):
    data = make_proto(3)
    out = collate_fn([data[2], data[0]])
    assert _ids(out) == [2, 0]
    assert out.non_tensor_batch[F.UID].tolist() == ["u2", "u0"]
    assert out.non_tensor_batch[F.EXTRA_INFO].tolist() == [{"index": 2}, {"index": 0}]
    assert out.batch.batch_size == torch.Size([2])
    with pytest.raises(ValueError, match="at least one"):
        collate_fn([])


def test_collate_fn_keeps_list_rows_one_dimensional():
    data = DataProto.from_dict({"t": torch.zeros(2)}, {"l": [[1, 2], [3, 4]]})
    out = collate_fn([data[0], data[1]])
    assert out.non_tensor_batch["l"].shape == (2,)
    assert out.non_tensor_batch["l"][1] == [3, 4]


def test_list_of_dict_to_dict_of_list():
    assert list_of_dict_to_dict_of_list([]) == {}
    assert list_of_dict_to_dict_of_list([{"a": 1, "b": 2}, {"a": 3, "b": 4}]) == {"a": [1, 3], "b": [2, 4]}
    assert list_of_dict_to_dict_of_list([{"a": 1}, {"a": 2, "c": 5}]) == {"a": [1, 2], "c": [5]}
    with pytest.raises(TypeError, match="dicts"):
        list_of_dict_to_dict_of_list([1])
