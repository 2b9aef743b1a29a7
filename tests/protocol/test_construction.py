"""Construction, consistency checks, len, from_dict / from_single_dict."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from tensordict import TensorDict

from hybridflow.protocol import AUTO_PADDING_KEY, DataProto


class MyProto(DataProto):
    pass


def test_from_dict_builds_batch_non_tensors_and_meta():
    data = DataProto.from_dict(
        {"a": torch.zeros(3, 2), "b": torch.ones(3)}, {"n": ["x", [1, 2], {"k": 1}]}, {"m": 5}
    )
    assert data.batch.batch_size == torch.Size([3])
    assert set(data.batch.keys()) == {"a", "b"}
    # a list becomes a 1-D object array, one entry per row, nested values kept whole
    assert data.non_tensor_batch["n"].shape == (3,)
    assert data.non_tensor_batch["n"].dtype == object
    assert data.non_tensor_batch["n"][1] == [1, 2]
    assert data.meta_info == {"m": 5}
    assert len(data) == 3


def test_from_dict_rejects_mismatched_batch_sizes():
    with pytest.raises(ValueError, match="'b'.*batch shape"):
        DataProto.from_dict({"a": torch.zeros(3, 2), "b": torch.zeros(4, 2)})


def test_from_dict_num_batch_dims_two_without_non_tensors():
    data = DataProto.from_dict({"a": torch.zeros(2, 3, 4)}, num_batch_dims=2)
    assert data.batch.batch_size == torch.Size([2, 3])
    with pytest.raises(ValueError, match="one batch dim"):
        DataProto.from_dict({"a": torch.zeros(2, 3)}, {"n": np.zeros(2)}, num_batch_dims=2)
    with pytest.raises(ValueError, match="num_batch_dims"):
        DataProto.from_dict({"a": torch.zeros(2)}, num_batch_dims=0)


def test_from_dict_auto_padding_sets_flag():
    data = DataProto.from_dict({"a": torch.zeros(2)}, auto_padding=True)
    assert data.meta_info[AUTO_PADDING_KEY] is True
    assert data.is_padding_enabled()
    assert not DataProto.from_dict({"a": torch.zeros(2)}).is_padding_enabled()


def test_from_dict_rejects_non_tensor_and_bad_non_tensor_types():
    with pytest.raises(TypeError, match="tensors\\['a'\\]"):
        DataProto.from_dict({"a": [1, 2]})
    with pytest.raises(TypeError, match="non_tensors\\['n'\\]"):
        DataProto.from_dict({"a": torch.zeros(2)}, {"n": "ab"})


def test_from_single_dict_splits_and_returns_subclass():
    data = MyProto.from_single_dict({"t": torch.arange(2), "n": np.array(["a", "b"])}, meta_info={"x": 1})
    assert type(data) is MyProto
    assert list(data.batch.keys()) == ["t"]
    assert list(data.non_tensor_batch) == ["n"]
    assert data.meta_info == {"x": 1}
    with pytest.raises(ValueError, match="'bad'.*list"):
        DataProto.from_single_dict({"t": torch.arange(2), "bad": [1, 2]})


def test_from_single_dict_auto_padding():
    assert DataProto.from_single_dict({"t": torch.arange(2)}, auto_padding=True).is_padding_enabled()


def test_len_semantics():
    assert len(DataProto()) == 0
    assert len(DataProto(non_tensor_batch={"n": np.arange(5)})) == 5
    assert len(DataProto(batch=TensorDict({}, batch_size=[7]))) == 7
    assert len(DataProto.from_dict({"a": torch.zeros(3, 9)})) == 3


def test_none_parts_become_empty_dicts():
    data = DataProto(batch=None, non_tensor_batch=None, meta_info=None)
    assert data.non_tensor_batch == {} and data.meta_info == {}


@pytest.mark.parametrize(
    ("kwargs", "error", "pattern"),
    [
        ({"non_tensor_batch": {"n": [1, 2]}}, TypeError, "non_tensor_batch\\['n'\\].*ndarray"),
        ({"non_tensor_batch": {"n": np.array(3)}}, ValueError, "0-d"),
        ({"non_tensor_batch": {"n": np.zeros(2), "m": np.zeros(3)}}, ValueError, "'m'.*3 rows"),
        (
            {"batch": TensorDict({"a": torch.zeros(2)}, batch_size=[2]), "non_tensor_batch": {"n": np.zeros(3)}},
            ValueError,
            "'n'.*3 rows, expected 2",
        ),
        ({"batch": {"a": torch.zeros(2)}}, TypeError, "TensorDict"),
        ({"batch": TensorDict({}, batch_size=[])}, ValueError, "batch dimension"),
        ({"meta_info": [1]}, TypeError, "meta_info"),
    ],
)
def test_consistency_errors(kwargs, error, pattern):
    with pytest.raises(error, match=pattern):
        DataProto(**kwargs)
