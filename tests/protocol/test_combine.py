"""union / concat / chunk / split / repeat / sample_level_repeat / reorder / unfold / padding."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hybridflow import fields as F
from hybridflow.protocol import DataProto


def _ids(data: DataProto) -> list[int]:
    return data.batch[F.INPUT_IDS][:, 0].tolist()


# --- union ---------------------------------------------------------------------------------


def test_union_adds_keys_in_place(proto):
    other = DataProto.from_dict({"values": torch.ones(4)}, {"extra": np.arange(4)}, {"step": 3})
    out = proto.union(other)
    assert out is proto
    assert set(proto.batch.keys()) == {F.INPUT_IDS, "score", "values"}
    assert proto.non_tensor_batch["extra"].tolist() == [0, 1, 2, 3]
    assert proto.meta_info == {"temperature": 1.0, "step": 3}


def test_union_accepts_equal_shared_keys(proto, make_proto):
    proto.union(make_proto())
    assert _ids(proto) == [0, 1, 2, 3]


@pytest.mark.parametrize(
    ("other", "key"),
    [
        (DataProto.from_dict({"score": torch.zeros(4)}), "score"),
        (DataProto(non_tensor_batch={F.UID: np.array(["u0", "u1", "u2", "x"], dtype=object)}), F.UID),
        (DataProto(meta_info={"temperature": 0.5}), "temperature"),
    ],
)
def test_union_conflict_names_key(proto, other, key):
    with pytest.raises(ValueError, match=repr(key)):
        proto.union(other)


def test_union_length_mismatch(proto, make_proto):
    with pytest.raises(ValueError, match="lengths differ: 4 vs 3"):
        proto.union(make_proto(3))


def test_union_batch_none_takes_other(make_proto):
    data = DataProto(non_tensor_batch={"n": np.arange(4)})
    data.union(make_proto())
    assert _ids(data) == [0, 1, 2, 3]


def test_union_numpy_nan_in_same_place_is_equal():
    a = DataProto(non_tensor_batch={"x": np.array([1.0, np.nan]), "o": np.array([np.nan, "s"], dtype=object)})
    b = DataProto(non_tensor_batch={"x": np.array([1.0, np.nan]), "o": np.array([float("nan"), "s"], dtype=object)})
    a.union(b)
    c = DataProto(non_tensor_batch={"x": np.array([np.nan, 1.0])})
    with pytest.raises(ValueError, match="'x'"):
        a.union(c)


def test_union_object_arrays_recurse():
    def rows(last):
        return np.array([{"a": [1, np.nan]}, np.array([1.0, np.nan]), last], dtype=object)

    a = DataProto(non_tensor_batch={"o": rows(("t", 1))})
    a.union(DataProto(non_tensor_batch={"o": rows(("t", 1))}))
    with pytest.raises(ValueError, match="'o'"):
        a.union(DataProto(non_tensor_batch={"o": rows(("t", 2))}))


def test_union_self_referencing_object_arrays():
    def self_ref(value):
        arr = np.empty(2, dtype=object)
        arr[0] = arr
        arr[1] = value
        return arr

    a = DataProto(non_tensor_batch={"o": self_ref(1)})
    a.union(DataProto(non_tensor_batch={"o": self_ref(1)}))
    with pytest.raises(ValueError, match="'o'"):
        a.union(DataProto(non_tensor_batch={"o": self_ref(2)}))


# --- concat --------------------------------------------------------------------------------


def test_concat_rows_and_meta(proto):
    parts = [proto[:1], proto[1:3], proto[3:]]
    out = DataProto.concat(parts)
    assert _ids(out) == [0, 1, 2, 3]
    assert out.non_tensor_batch[F.UID].tolist() == ["u0", "u1", "u2", "u3"]
    assert out.meta_info == {"temperature": 1.0}


def test_concat_merges_metrics(proto):
    a, b, c = proto[:1], proto[1:2], proto[2:]
    a.meta_info["metrics"] = {"loss": 1.0}
    b.meta_info["metrics"] = [{"loss": 2.0}, {"loss": 3.0, "acc": 0.5}]
    c.meta_info.pop("metrics", None)  # absent in this part
    out = DataProto.concat([a, b, c])
    assert out.meta_info["metrics"] == {"loss": [1.0, 2.0, 3.0], "acc": [0.5]}
    assert out.meta_info["temperature"] == 1.0


def test_concat_conflicting_meta(proto):
    a, b = proto[:2], proto[2:]
    b.meta_info["temperature"] = 0.7
    with pytest.raises(ValueError, match="Conflicting values for meta_info key 'temperature'"):
        DataProto.concat([a, b])


def test_concat_keeps_subclass_and_checks_keys(proto):
    class Sub(DataProto):
        pass

    assert type(DataProto.concat([Sub(batch=proto.batch, non_tensor_batch=proto.non_tensor_batch)])) is Sub
    with pytest.raises(ValueError, match="at least one"):
        DataProto.concat([])
    with pytest.raises(ValueError, match="non_tensor_batch keys"):
        DataProto.concat([proto, proto.select(non_tensor_batch_keys=[F.UID])])
    with pytest.raises(ValueError, match="batch keys"):
        DataProto.concat([proto, proto.select(batch_keys=["score"])])
    with pytest.raises(ValueError, match="tensor batch"):
        DataProto.concat([proto, DataProto(non_tensor_batch=dict(proto.non_tensor_batch))])


def test_concat_only_non_tensors():
    a = DataProto(non_tensor_batch={"n": np.array([1, 2])})
    b = DataProto(non_tensor_batch={"n": np.array([3])})
    out = DataProto.concat([a, b])
    assert out.batch is None and out.non_tensor_batch["n"].tolist() == [1, 2, 3]


# --- chunk / split -------------------------------------------------------------------------


def test_chunk_equal_parts_share_meta(make_proto):
    parts = make_proto(6).chunk(3)
    assert [_ids(p) for p in parts] == [[0, 1], [2, 3], [4, 5]]
    assert [p.non_tensor_batch[F.UID].tolist() for p in parts] == [["u0", "u1"], ["u2", "u3"], ["u4", "u5"]]
    assert all(p.meta_info == {"temperature": 1.0} for p in parts)


def test_chunk_not_divisible(make_proto):
    with pytest.raises(ValueError, match="5 rows cannot be cut into 2 chunks"):
        make_proto(5).chunk(2)
    padded = make_proto(5)
    padded.meta_info["_verl_auto_padding"] = True
    assert [len(p) for p in padded.chunk(2)] == [3, 2]
    with pytest.raises(ValueError, match="chunks"):
        make_proto(4).chunk(0)


def test_chunk_only_non_tensors():
    data = DataProto(non_tensor_batch={"n": np.arange(4)})
    assert [p.non_tensor_batch["n"].tolist() for p in data.chunk(2)] == [[0, 1], [2, 3]]


def test_split(make_proto):
    parts = make_proto(5).split(2)
    assert [_ids(p) for p in parts] == [[0, 1], [2, 3], [4]]
    assert make_proto(0).split(3) == []


# --- repeat / sample_level_repeat / reorder ------------------------------------------------


def test_repeat_interleave_and_tile(make_proto):
    data = make_proto(2)
    inter = data.repeat(repeat_times=2, interleave=True)
    assert _ids(inter) == [0, 0, 1, 1]
    assert inter.non_tensor_batch[F.UID].tolist() == ["u0", "u0", "u1", "u1"]
    tiled = data.repeat(repeat_times=3, interleave=False)
    assert _ids(tiled) == [0, 1, 0, 1, 0, 1]
    assert tiled.non_tensor_batch[F.UID].tolist() == ["u0", "u1"] * 3
    assert tiled.batch.batch_size == torch.Size([6])
    assert tiled.meta_info == data.meta_info


def test_repeat_2d_non_tensor():
    data = DataProto(non_tensor_batch={"n": np.array([[1, 2], [3, 4]])})
    assert data.repeat(2).non_tensor_batch["n"].tolist() == [[1, 2], [1, 2], [3, 4], [3, 4]]
    assert data.repeat(2, interleave=False).non_tensor_batch["n"].tolist() == [[1, 2], [3, 4], [1, 2], [3, 4]]


@pytest.mark.parametrize("counts", [[2, 0, 1], np.array([2, 0, 1]), torch.tensor([2, 0, 1])])
def test_sample_level_repeat(make_proto, counts):
    out = make_proto(3).sample_level_repeat(counts)
    assert _ids(out) == [0, 0, 2]
    assert out.non_tensor_batch[F.UID].tolist() == ["u0", "u0", "u2"]


def test_sample_level_repeat_errors(make_proto):
    with pytest.raises(ValueError, match="2 counts for 3 rows"):
        make_proto(3).sample_level_repeat([1, 1])
    with pytest.raises(ValueError, match="non-negative"):
        make_proto(3).sample_level_repeat([1, -1, 1])


def test_reorder_in_place(proto):
    assert proto.reorder(torch.tensor([3, 1, 0, 2])) is None
    assert _ids(proto) == [3, 1, 0, 2]
    assert proto.non_tensor_batch[F.UID].tolist() == ["u3", "u1", "u0", "u2"]
    proto.reorder(np.array([1, 2, 3, 0]))
    assert _ids(proto) == [1, 0, 2, 3]


# --- unfold_column_chunks ------------------------------------------------------------------


def test_unfold_column_chunks():
    data = DataProto.from_dict(
        {"grid": torch.arange(8).view(2, 4), "other": torch.tensor([10, 20])},
        {"pairs": np.array([["a", "b"], ["c", "d"]], dtype=object), "uid": np.array(["x", "y"], dtype=object)},
        {"m": 1},
    )
    out = data.unfold_column_chunks(2, split_keys=["grid", "pairs"])
    assert out.batch["grid"].tolist() == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert out.batch["other"].tolist() == [10, 10, 20, 20]
    assert out.non_tensor_batch["pairs"].tolist() == [["a"], ["b"], ["c"], ["d"]]
    assert out.non_tensor_batch["uid"].tolist() == ["x", "x", "y", "y"]
    assert out.meta_info == {"m": 1}
    repeated = data.unfold_column_chunks(2)
    assert repeated.batch["grid"].tolist() == [[0, 1, 2, 3], [0, 1, 2, 3], [4, 5, 6, 7], [4, 5, 6, 7]]
    with pytest.raises(ValueError, match="'grid'.*divide by 3"):
        data.unfold_column_chunks(3, split_keys=["grid"])


# --- padding -------------------------------------------------------------------------------


def test_padding_last_and_first(make_proto):
    data = make_proto(3)
    data.padding(2)
    assert _ids(data) == [0, 1, 2, 2, 2]
    assert data.non_tensor_batch[F.UID].tolist() == ["u0", "u1", "u2", "u2", "u2"]
    first = make_proto(3)
    first.padding(1, padding_candidate="first")
    assert _ids(first) == [0, 1, 2, 0]
    unchanged = make_proto(3)
    unchanged.padding(0)
    assert len(unchanged) == 3


def test_padding_errors(make_proto):
    with pytest.raises(ValueError, match="padding_candidate"):
        make_proto(3).padding(1, padding_candidate="middle")
    with pytest.raises(ValueError, match="empty"):
        make_proto(0).padding(1)
