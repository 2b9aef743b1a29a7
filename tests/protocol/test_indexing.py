"""select / select_idxs / slice / __getitem__ / pop / rename."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hybridflow import fields as F
from hybridflow.protocol import DataProto, DataProtoItem


def _ids(data: DataProto) -> list[int]:
    return data.batch[F.INPUT_IDS][:, 0].tolist()


def _assert_int_batch_size(data: DataProto, n: int) -> None:
    assert data.batch.batch_size == torch.Size([n])
    assert all(type(d) is int for d in data.batch.batch_size)


@pytest.mark.parametrize(
    "idxs",
    [
        [2, 0],
        np.array([2, 0]),
        torch.tensor([2, 0]),
        np.array([2, 0], dtype=np.int32),
        torch.tensor([2, 0], dtype=torch.int32),
    ],
)
def test_select_idxs_int(proto, idxs):
    out = proto.select_idxs(idxs)
    assert _ids(out) == [2, 0]
    assert out.non_tensor_batch[F.UID].tolist() == ["u2", "u0"]
    assert out.meta_info == {"temperature": 1.0}
    _assert_int_batch_size(out, 2)


@pytest.mark.parametrize(
    "mask",
    [[False, True, False, True], np.array([False, True, False, True]), torch.tensor([False, True, False, True])],
)
def test_select_idxs_bool(proto, mask):
    out = proto.select_idxs(mask)
    assert _ids(out) == [1, 3]
    assert out.non_tensor_batch[F.UID].tolist() == ["u1", "u3"]
    _assert_int_batch_size(out, 2)


def test_select_idxs_empty_and_errors(proto):
    empty = proto.select_idxs([])
    assert len(empty) == 0 and empty.non_tensor_batch[F.UID].shape == (0,)
    with pytest.raises(ValueError, match="mask has length 2"):
        proto.select_idxs([True, False])
    with pytest.raises(IndexError, match="out of range"):
        proto.select_idxs([4])
    with pytest.raises(TypeError, match="integers or booleans"):
        proto.select_idxs(np.array([0.5]))
    with pytest.raises(TypeError, match="list, ndarray or tensor"):
        proto.select_idxs(1)


def test_select_idxs_only_non_tensors():
    data = DataProto(non_tensor_batch={"n": np.array([10, 11, 12])})
    assert data.select_idxs([2, 2]).non_tensor_batch["n"].tolist() == [12, 12]
    assert data.select_idxs([2, 2]).batch is None


def test_getitem_dispatch(proto):
    sliced = proto[1:3]
    assert _ids(sliced) == [1, 2]
    _assert_int_batch_size(sliced, 2)
    assert _ids(proto[::2]) == [0, 2]
    assert _ids(proto[[3, 1]]) == [3, 1]
    assert _ids(proto[np.array([3])]) == [3]
    assert _ids(proto[torch.tensor([True, False, False, True])]) == [0, 3]
    item = proto[2]
    assert isinstance(item, DataProtoItem)
    assert item.batch[F.INPUT_IDS].tolist() == [2, 12, 22]
    assert item.batch.batch_size == torch.Size([])
    assert item.non_tensor_batch == {F.UID: "u2", F.EXTRA_INFO: {"index": 2}}
    assert item.meta_info == {"temperature": 1.0}
    assert proto[-1].non_tensor_batch[F.UID] == "u3"
    assert proto[np.int64(1)].non_tensor_batch[F.UID] == "u1"
    assert proto[torch.tensor(1)].non_tensor_batch[F.UID] == "u1"


def test_getitem_errors(proto):
    with pytest.raises(IndexError, match="row 4"):
        proto[4]
    with pytest.raises(TypeError, match="str"):
        proto["input_ids"]


def test_iter_yields_items(proto):
    assert [item.non_tensor_batch[F.UID] for item in proto] == ["u0", "u1", "u2", "u3"]


def test_slice_method(proto):
    assert _ids(proto.slice(1, None, 2)) == [1, 3]
    assert proto.slice(1, 3).non_tensor_batch[F.EXTRA_INFO].tolist() == [{"index": 1}, {"index": 2}]
    assert len(proto.slice(3, 3)) == 0


def test_select_keys(proto):
    out = proto.select(batch_keys=["score"], non_tensor_batch_keys=[F.UID], meta_info_keys=[])
    assert list(out.batch.keys()) == ["score"]
    assert list(out.non_tensor_batch) == [F.UID]
    assert out.meta_info == {}
    # None keeps everything; the new meta dict is a copy
    everything = proto.select()
    assert set(everything.batch.keys()) == {F.INPUT_IDS, "score"}
    everything.meta_info["new"] = 1
    assert "new" not in proto.meta_info


def test_select_missing_keys(proto):
    with pytest.raises(KeyError, match="nope"):
        proto.select(batch_keys=["nope"])
    # like verl, absent non-tensor and meta keys are skipped
    out = proto.select(non_tensor_batch_keys=["absent"], meta_info_keys=["absent"])
    assert out.non_tensor_batch == {} and out.meta_info == {}


def test_select_deepcopy(proto):
    shared = proto.select(batch_keys=["score"])
    copied = proto.select(batch_keys=["score"], deepcopy=True)
    proto.batch["score"][0] = 100.0
    proto.non_tensor_batch[F.EXTRA_INFO][0]["index"] = 99
    assert shared.batch["score"][0].item() == 100.0
    assert copied.batch["score"][0].item() == 0.0
    assert copied.non_tensor_batch[F.EXTRA_INFO][0] == {"index": 0}


def test_pop(proto):
    popped = proto.pop(batch_keys=["score"], non_tensor_batch_keys=[F.UID], meta_info_keys=["temperature"])
    assert list(popped.batch.keys()) == ["score"]
    assert popped.batch["score"].tolist() == [0.0, 0.5, 1.0, 1.5]
    assert popped.non_tensor_batch[F.UID].tolist() == ["u0", "u1", "u2", "u3"]
    assert popped.meta_info == {"temperature": 1.0}
    assert list(proto.batch.keys()) == [F.INPUT_IDS]
    assert list(proto.non_tensor_batch) == [F.EXTRA_INFO]
    assert proto.meta_info == {}


def test_pop_missing_key_changes_nothing(proto):
    with pytest.raises(KeyError, match="'nope'.*non_tensor_batch"):
        proto.pop(batch_keys=["score"], non_tensor_batch_keys=["nope"])
    assert "score" in proto.batch.keys()


def test_pop_only_non_tensors(proto):
    popped = proto.pop(non_tensor_batch_keys=[F.UID])
    assert popped.batch is None and len(popped) == 4


def test_rename(proto):
    out = proto.rename("score", "reward")
    assert out is proto
    assert set(proto.batch.keys()) == {F.INPUT_IDS, "reward"}
    proto.rename([F.INPUT_IDS, F.UID], ["ids", "group"])
    assert set(proto.batch.keys()) == {"ids", "reward"}
    assert set(proto.non_tensor_batch) == {"group", F.EXTRA_INFO}
    with pytest.raises(ValueError, match="2 old keys but 1 new"):
        proto.rename(["a", "b"], ["c"])
    with pytest.raises(KeyError, match="'missing'"):
        proto.rename("missing", "x")
