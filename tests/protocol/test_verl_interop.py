"""Code written for verl's protocol keeps working: TensorDict conversion, the serialization
helpers, ``AssertionError``-compatible checks, and uneven chunking."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from tensordict import NonTensorData, NonTensorStack, TensorDict

from hybridflow.protocol import (
    DataProto,
    DataProtoError,
    deserialize_single_tensor,
    deserialize_tensordict,
    serialize_single_tensor,
    serialize_tensordict,
    union_numpy_dict,
    union_tensor_dict,
)


def proto(rows: int = 4, **meta) -> DataProto:
    messages = [[{"role": "user", "content": f"q{i}"}] for i in range(rows)]
    extra = np.empty(rows, dtype=object)
    extra[:] = [{"index": i, "tags": ["a", i]} for i in range(rows)]
    chats = np.empty(rows, dtype=object)
    chats[:] = messages
    return DataProto.from_dict(
        tensors={"ids": torch.arange(rows * 3).view(rows, 3), "mask": torch.ones(rows, 3, dtype=torch.bool)},
        non_tensors={"uid": np.array([f"u{i}" for i in range(rows)], dtype=object), "extra_info": extra, "raw": chats},
        meta_info={"temperature": 0.7, **meta},
    )


# --- TensorDict both ways ---------------------------------------------------------------------


def test_to_and_from_tensordict_round_trip_keeps_every_part():
    data = proto()
    td = data.to_tensordict()
    entries = dict(td.items())
    assert isinstance(entries["uid"], NonTensorStack) and isinstance(entries["temperature"], NonTensorData)
    back = DataProto.from_tensordict(td)
    assert torch.equal(back.batch["ids"], data.batch["ids"]) and back.batch["mask"].dtype == torch.bool
    assert back.non_tensor_batch["uid"].tolist() == ["u0", "u1", "u2", "u3"]
    assert back.non_tensor_batch["extra_info"][2] == {"index": 2, "tags": ["a", 2]}
    assert back.non_tensor_batch["raw"][1] == [{"role": "user", "content": "q1"}]
    assert back.meta_info == {"temperature": 0.7}


def test_from_tensordict_reads_a_tensordict_built_the_verl_way():
    # verl: tensors as they are, each non-tensor column a NonTensorStack of NonTensorData,
    # meta values as NonTensorData
    td = TensorDict({"responses": torch.tensor([[1, 2], [3, 4]])}, batch_size=[2])
    td["data_source"] = NonTensorStack.from_list([NonTensorData("gsm8k"), NonTensorData("math")])
    td["eos_token_id"] = NonTensorData(2)
    data = DataProto.from_tensordict(td, meta_info={"global_steps": 3})
    assert data.non_tensor_batch["data_source"].tolist() == ["gsm8k", "math"]
    assert data.meta_info == {"eos_token_id": 2, "global_steps": 3}
    assert data.batch["responses"].tolist() == [[1, 2], [3, 4]]


def test_to_tensordict_refuses_a_key_in_two_parts():
    data = proto()
    data.meta_info["uid"] = "clash"
    with pytest.raises(AssertionError, match="uid"):
        data.to_tensordict()


# --- serialization helpers --------------------------------------------------------------------


@pytest.mark.parametrize(
    "tensor",
    [
        torch.randn(3, 4),
        torch.randn(2, 3).to(torch.bfloat16),
        torch.randn(5).to(torch.float16),
        torch.arange(6, dtype=torch.int64).view(2, 3),
        torch.tensor([True, False, True]),
        torch.tensor(7, dtype=torch.int32),  # 0-d
        torch.randn(4, 6)[:, ::2],  # not contiguous
        torch.empty(0, 3),
    ],
)
def test_single_tensor_round_trip_keeps_dtype_shape_and_values(tensor):
    encoded = serialize_single_tensor(tensor)
    dtype, shape, data = encoded
    assert dtype == str(tensor.dtype).removeprefix("torch.") and tuple(shape) == tuple(tensor.shape)
    assert isinstance(data, np.ndarray) and data.dtype == np.uint8
    assert data.nbytes == tensor.numel() * tensor.element_size()
    decoded = deserialize_single_tensor(encoded)
    assert decoded.dtype == tensor.dtype and decoded.shape == tensor.shape
    assert torch.equal(decoded, tensor)
    before = tensor.clone()
    decoded.fill_(1)  # writable, and not aliasing the source
    assert torch.equal(tensor, before)


def test_deserialize_accepts_raw_bytes_as_sent_over_a_socket():
    tensor = torch.tensor([[1.5, -2.0]], dtype=torch.float32)
    dtype, shape, data = serialize_single_tensor(tensor)
    assert torch.equal(deserialize_single_tensor((dtype, tuple(shape), data.tobytes())), tensor)


def test_deserialize_rejects_bad_encodings():
    with pytest.raises(AssertionError, match="not a torch dtype"):
        deserialize_single_tensor(("float33", (1,), b"\x00" * 4))
    with pytest.raises(AssertionError, match="bytes cannot hold"):
        deserialize_single_tensor(("float32", (2,), b"\x00" * 4))


def test_tensordict_round_trip_with_mixed_and_nested_content():
    nested = torch.nested.as_nested_tensor([torch.arange(3.0), torch.arange(5.0)], layout=torch.jagged)
    td = TensorDict({"a": torch.randn(2, 3).to(torch.bfloat16), "b": torch.tensor([1, 2]), "n": nested}, batch_size=[2])
    batch_size, device, items = serialize_tensordict(td)
    assert batch_size == (2,) and device is None
    assert items["n"][0] == "jagged" and len(items["n"][1]) == 2 and len(items["a"]) == 3
    back = deserialize_tensordict((batch_size, device, items))
    assert back.batch_size == td.batch_size and back["a"].dtype == torch.bfloat16
    assert torch.equal(back["a"], td["a"]) and torch.equal(back["b"], td["b"])
    assert [t.tolist() for t in back["n"].unbind()] == [[0.0, 1.0, 2.0], [0.0, 1.0, 2.0, 3.0, 4.0]]


def test_deserialize_tensordict_rejects_a_malformed_entry():
    with pytest.raises(AssertionError, match="expected 3"):
        deserialize_tensordict(((1,), None, {"x": ("float32", (1,), b"\x00" * 4, "extra")}))


# --- checks that verl code catches as AssertionError -------------------------------------------


def test_union_conflicts_are_value_and_assertion_errors():
    a, b = proto(), proto()
    b.batch["ids"] = b.batch["ids"] + 1
    with pytest.raises(AssertionError, match="'ids' differs"):
        a.union(b)
    with pytest.raises(ValueError, match="'ids' differs"):
        union_tensor_dict(proto().batch, b.batch)
    c = proto()
    c.non_tensor_batch["uid"] = np.array(["x"] * 4, dtype=object)
    with pytest.raises(AssertionError, match="'uid' differs"):
        union_numpy_dict(proto().non_tensor_batch, c.non_tensor_batch)
    with pytest.raises(AssertionError, match="lengths differ"):
        proto(4).union(proto(2))


def test_unequal_chunking_is_an_assertion_error_without_padding():
    with pytest.raises(AssertionError, match="cannot be cut into 4 chunks"):
        proto(10).chunk(4)
    with pytest.raises(ValueError, match="cannot be cut into 4 chunks"):
        proto(10).chunk(4)


def test_uneven_chunking_with_auto_padding_matches_verl():
    data = proto(10)
    data.meta_info["_verl_auto_padding"] = True
    parts = data.chunk(4)
    assert [len(p) for p in parts] == [3, 3, 3, 1]  # torch.chunk sizes, as verl's TensorDict.chunk
    assert [p.non_tensor_batch["uid"].tolist() for p in parts][-1] == ["u9"]
    assert torch.equal(torch.cat([p.batch["ids"] for p in parts]), data.batch["ids"])
    seven = proto(7)
    seven.meta_info["_verl_auto_padding"] = True
    assert [len(p) for p in seven.chunk(3)] == [3, 3, 1]
    six = proto(6)
    six.meta_info["_verl_auto_padding"] = True
    with pytest.raises(AssertionError, match="makes 3 parts"):  # verl: IndexError
        six.chunk(4)


def test_conflicting_meta_on_concat_is_an_assertion_error():
    with pytest.raises(AssertionError, match="Conflicting values for meta_info key 'temperature'"):
        DataProto.concat([proto(2), _with_meta(proto(2), temperature=1.0)])


def _with_meta(data: DataProto, **meta) -> DataProto:
    data.meta_info.update(meta)
    return data


def test_bad_constructor_input_is_an_assertion_error():
    batch = TensorDict({"a": torch.zeros(2)}, batch_size=[2])
    with pytest.raises(AssertionError, match="must be a numpy ndarray"):
        DataProto(batch=batch, non_tensor_batch={"b": [1, 2]})
    with pytest.raises(AssertionError, match="has 3 rows, expected 2"):
        DataProto(batch=TensorDict({"a": torch.zeros(2)}, batch_size=[2]),
                  non_tensor_batch={"b": np.zeros(3, dtype=object)})
    with pytest.raises(TypeError, match="must be a numpy ndarray"):
        DataProto(batch=batch, non_tensor_batch={"b": [1, 2]})


def test_missing_keys_are_key_and_assertion_errors():
    with pytest.raises(AssertionError, match="not in"):
        proto().pop(batch_keys=["nope"])
    with pytest.raises(KeyError):
        proto().select(batch_keys=["nope"])


def test_error_classes_are_both():
    assert issubclass(DataProtoError, ValueError) and issubclass(DataProtoError, AssertionError)
