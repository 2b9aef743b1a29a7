"""TensorDict round trip, pickling, disk, device moves, introspection, make_iterator."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch
from tensordict import NonTensorData, NonTensorStack, TensorDict

from hybridflow import fields as F
from hybridflow.protocol import DataProto


def _assert_same(a: DataProto, b: DataProto) -> None:
    assert (a.batch is None) == (b.batch is None)
    if a.batch is not None:
        assert a.batch.batch_size == b.batch.batch_size
        assert set(a.batch.keys()) == set(b.batch.keys())
        for key in a.batch.keys():
            assert torch.equal(a.batch[key], b.batch[key])
    assert set(a.non_tensor_batch) == set(b.non_tensor_batch)
    for key in a.non_tensor_batch:
        assert a.non_tensor_batch[key].tolist() == b.non_tensor_batch[key].tolist()
    assert a.meta_info == b.meta_info


def test_to_tensordict_layout(proto):
    td = proto.to_tensordict()
    assert td.batch_size == torch.Size([4])
    assert isinstance(td.get(F.UID), NonTensorStack)
    assert isinstance(td.get("temperature"), NonTensorData)
    assert torch.equal(td[F.INPUT_IDS], proto.batch[F.INPUT_IDS])


def test_tensordict_round_trip_keeps_nested_values():
    messages = [
        [{"role": "user", "content": "hi"}],
        [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}],
        [],
    ]
    data = DataProto.from_dict(
        {"t": torch.arange(6).view(3, 2)},
        {
            F.RAW_PROMPT: messages,
            "lists": [[1, 2], [3, 4], [5, 6]],  # equal-length lists must not become a 2-D column
            F.REWARD_MODEL: [{"ground_truth": "4", "style": "rule"}] * 3,
        },
        {"metrics": {"a": [1.0]}, "eos_token_id": [2, 3]},
    )
    back = DataProto.from_tensordict(data.to_tensordict())
    _assert_same(data, back)
    assert back.non_tensor_batch["lists"].shape == (3,)
    assert back.non_tensor_batch[F.RAW_PROMPT][1][1] == {"role": "assistant", "content": "4"}


def test_tensordict_round_trip_only_non_tensors():
    data = DataProto(non_tensor_batch={"n": np.array(["a", "b"], dtype=object)}, meta_info={"k": 1})
    back = DataProto.from_tensordict(data.to_tensordict())
    assert back.batch is None
    _assert_same(data, back)


def test_from_tensordict_extra_meta_and_errors(proto):
    back = DataProto.from_tensordict(proto.to_tensordict(), meta_info={"extra": 2})
    assert back.meta_info == {"temperature": 1.0, "extra": 2}
    with pytest.raises(TypeError, match="TensorDict"):
        DataProto.from_tensordict({"a": torch.zeros(2)})
    with pytest.raises(ValueError, match="num_batch_dims"):
        DataProto.from_tensordict(TensorDict({"a": torch.zeros(2, 3)}, batch_size=[2, 3]))
    clash = DataProto.from_dict({"k": torch.zeros(2)}, meta_info={"k": 1})
    with pytest.raises(ValueError, match="'k' clashes"):
        clash.to_tensordict()


def test_to_device_returns_self(proto):
    assert proto.to("cpu") is proto
    assert proto.batch.device == torch.device("cpu")
    assert DataProto(non_tensor_batch={"n": np.arange(2)}).to("cpu").batch is None


def test_pickle_round_trip(proto):
    _assert_same(proto, pickle.loads(pickle.dumps(proto)))


def test_pickle_empty_tensordict_keeps_batch_size():
    data = DataProto(batch=TensorDict({}, batch_size=[5]))
    back = pickle.loads(pickle.dumps(data))
    assert back.batch.batch_size == torch.Size([5])
    assert len(back) == 5


def test_pickle_keeps_device_and_empty_proto(proto):
    proto.to("cpu")
    assert pickle.loads(pickle.dumps(proto)).batch.device == torch.device("cpu")
    empty = pickle.loads(pickle.dumps(DataProto()))
    assert empty.batch is None and len(empty) == 0


def test_save_and_load_from_disk(proto, tmp_path):
    path = tmp_path / "batch.pkl"
    proto.save_to_disk(path)
    _assert_same(proto, DataProto.load_from_disk(path))
    other = tmp_path / "other.pkl"
    other.write_bytes(pickle.dumps({"not": "a DataProto"}))
    with pytest.raises(TypeError, match="not a DataProto"):
        DataProto.load_from_disk(other)


def test_print_size(proto, capsys):
    message = proto.print_size(prefix="rollout")
    # input_ids 4x3 int64 = 96 bytes, score 4 float32 = 16 bytes
    assert message.startswith(f"rollout, Size of tensordict: {112 / 1024**3} GB")
    assert capsys.readouterr().out.strip() == message


def test_get_data_info(proto):
    info = proto.get_data_info()
    assert "DataProto with 4 rows" in info
    assert f"  {F.INPUT_IDS}: (4, 3) (torch.int64) cpu" in info
    assert f"  {F.UID}: ndarray(4,) (object)" in info
    assert "  temperature: float" in info


# --- make_iterator -------------------------------------------------------------------------


def _batches(data: DataProto, **kwargs) -> list[list[int]]:
    return [b.batch[F.INPUT_IDS][:, 0].tolist() for b in data.make_iterator(**kwargs)]


def test_make_iterator_in_order(make_proto):
    data = make_proto(6)
    assert _batches(data, mini_batch_size=2, epochs=2) == [[0, 1], [2, 3], [4, 5]] * 2
    for mini in data.make_iterator(mini_batch_size=3, epochs=1):
        assert mini.meta_info == {"temperature": 1.0}
        assert mini.non_tensor_batch[F.UID].tolist() == [f"u{i}" for i in mini.batch[F.INPUT_IDS][:, 0].tolist()]


def test_make_iterator_seeded_shuffle_is_deterministic(make_proto):
    data = make_proto(8)
    kwargs = {"mini_batch_size": 2, "epochs": 2, "seed": 7, "dataloader_kwargs": {"shuffle": True}}
    first, second = _batches(data, **kwargs), _batches(data, **kwargs)
    assert first == second
    epoch1, epoch2 = first[:4], first[4:]
    assert sorted(sum(epoch1, [])) == list(range(8)) and sorted(sum(epoch2, [])) == list(range(8))
    assert epoch1 != epoch2  # each epoch draws its own permutation
    assert _batches(data, **{**kwargs, "seed": 8}) != first


def test_make_iterator_errors(make_proto):
    with pytest.raises(ValueError, match="5 rows is not a multiple of mini_batch_size=2"):
        make_proto(5).make_iterator(mini_batch_size=2, epochs=1)
    with pytest.raises(ValueError, match="num_workers"):
        make_proto(4).make_iterator(mini_batch_size=2, epochs=1, dataloader_kwargs={"num_workers": 2})
