from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from hybridflow.data import RLDataset, collate_fn, left_pad, truncate_ids
from hybridflow.data.schema import DataRowError
from hybridflow.protocol import DataProto

IDS = [1, 2, 3, 4, 5, 6, 7]


@pytest.mark.parametrize(
    "mode, expected",
    [("left", [4, 5, 6, 7]), ("right", [1, 2, 3, 4]), ("middle", [1, 2, 6, 7])],
)
def test_truncate_ids(mode, expected):
    assert truncate_ids(IDS, 4, mode) == expected
    assert truncate_ids(IDS, 7, mode) == IDS


def test_truncate_middle_odd_and_error():
    assert truncate_ids(IDS, 5, "middle") == [1, 2, 5, 6, 7]  # head 2, tail 3
    with pytest.raises(ValueError, match="7 tokens, more than max_length=4"):
        truncate_ids(IDS, 4, "error")
    with pytest.raises(ValueError, match="unknown truncation mode 'top'"):
        truncate_ids(IDS, 4, "top")


def test_left_pad_values():
    ids, mask, pos = left_pad([11, 12, 13], 5, pad_token_id=0)
    assert ids.tolist() == [0, 0, 11, 12, 13]
    assert mask.tolist() == [0, 0, 1, 1, 1]
    assert pos.tolist() == [0, 0, 0, 1, 2]
    assert ids.dtype == mask.dtype == pos.dtype == torch.long


def _templated_ids(tokenizer, question):
    text = tokenizer.apply_chat_template([{"role": "user", "content": question}], add_generation_prompt=True, tokenize=False)
    assert text.endswith("<|im_start|>assistant\n")  # the generation prompt is there
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def test_item_is_templated_and_left_padded(tokenizer, write_jsonl, make_row):
    path = write_jsonl("t.jsonl", [make_row("What is 2 + 3?", "5", index=9)])
    ds = RLDataset(path, tokenizer, max_prompt_length=40, return_raw_chat=True)
    item = ds[0]
    expected = _templated_ids(tokenizer, "What is 2 + 3?")
    n_pad = 40 - len(expected)
    assert n_pad > 0
    assert item["input_ids"].tolist() == [tokenizer.pad_token_id] * n_pad + expected
    assert item["attention_mask"].tolist() == [0] * n_pad + [1] * len(expected)
    assert item["position_ids"].tolist() == [0] * n_pad + list(range(len(expected)))
    assert item["raw_prompt_ids"] == expected
    assert item["raw_prompt"] == [{"role": "user", "content": "What is 2 + 3?"}]
    assert (item["index"], item["data_source"], item["ability"]) == (9, "hybridflow/arithmetic", "math")
    assert item["reward_model"] == {"style": "rule", "ground_truth": "5"}
    assert "raw_prompt" not in RLDataset(path, tokenizer, max_prompt_length=40)[0]


def test_overlong_prompt_error_names_row(tokenizer, write_jsonl, make_row):
    path = write_jsonl("long.jsonl", [make_row("short"), make_row("word " * 50)])
    with pytest.raises(DataRowError, match=r"long.jsonl: row 1: field 'prompt': prompt is \d+ tokens"):
        RLDataset(path, tokenizer, max_prompt_length=30)


def test_filter_and_truncate(tokenizer, write_jsonl, make_row):
    path = write_jsonl("long.jsonl", [make_row("short"), make_row("word " * 50), make_row("tiny")])
    filtered = RLDataset(path, tokenizer, max_prompt_length=30, filter_overlong_prompts=True)
    assert (len(filtered), filtered.num_filtered) == (2, 1)
    assert [filtered[i]["index"] for i in range(2)] == [0, 2]
    full = _templated_ids(tokenizer, "word " * 50)
    left = RLDataset(path, tokenizer, max_prompt_length=30, truncation="left")
    assert left[1]["input_ids"].tolist() == full[-30:]
    assert left[1]["attention_mask"].tolist() == [1] * 30
    right = RLDataset(path, tokenizer, max_prompt_length=30, truncation="right")
    assert right[1]["raw_prompt_ids"] == full[:30]


def test_all_filtered_is_an_error(tokenizer, write_jsonl, make_row):
    path = write_jsonl("long.jsonl", [make_row("word " * 50)])
    with pytest.raises(ValueError, match="every prompt .* is longer than max_prompt_length=10"):
        RLDataset(path, tokenizer, max_prompt_length=10, filter_overlong_prompts=True)


def test_max_samples(tokenizer, write_jsonl, make_row):
    path = write_jsonl("m.jsonl", [make_row(f"q{i}") for i in range(10)])
    first = RLDataset(path, tokenizer, max_samples=3, max_prompt_length=32)
    assert [first[i]["index"] for i in range(3)] == [0, 1, 2]
    a = RLDataset(path, tokenizer, max_samples=4, seed=1, max_prompt_length=32)
    b = RLDataset(path, tokenizer, max_samples=4, seed=1, max_prompt_length=32)
    picked = [a[i]["index"] for i in range(4)]
    assert picked == [b[i]["index"] for i in range(4)] and picked == sorted(picked) and picked != [0, 1, 2, 3]
    assert len(RLDataset(path, tokenizer, max_samples=-1, max_prompt_length=32)) == 10


def test_several_files_concatenate(tokenizer, write_jsonl, make_row):
    a = write_jsonl("a.jsonl", [make_row("x", index=0)])
    b = write_jsonl("b.jsonl", [make_row("y", index=0, source="openai/gsm8k")])
    ds = RLDataset([a, b], tokenizer, max_prompt_length=32)
    assert [ds[i]["data_source"] for i in range(2)] == ["hybridflow/arithmetic", "openai/gsm8k"]


def test_tokenizer_without_chat_template(tokenizer, write_jsonl, make_row):
    path = write_jsonl("a.jsonl", [make_row("x")])
    no_template = type(tokenizer)(tokenizer_object=tokenizer.backend_tokenizer, pad_token="<|pad|>")
    with pytest.raises(ValueError, match="no chat template"):
        RLDataset(path, no_template, max_prompt_length=32)


def test_bad_arguments(tokenizer, write_jsonl, make_row):
    path = write_jsonl("a.jsonl", [make_row("x")])
    with pytest.raises(ValueError, match="truncation must be one of"):
        RLDataset(path, tokenizer, truncation="cut")
    with pytest.raises(ValueError, match="max_prompt_length must be a positive integer"):
        RLDataset(path, tokenizer, max_prompt_length=0)
    with pytest.raises(ValueError, match="at least one data file"):
        RLDataset([], tokenizer)


def test_collate_into_dataproto(tokenizer, write_jsonl, make_row):
    path = write_jsonl("a.jsonl", [make_row("x", "1"), make_row("y", "2"), make_row("z", "3")])
    ds = RLDataset(path, tokenizer, max_prompt_length=32, return_raw_chat=True)
    batch = collate_fn([ds[0], ds[1], ds[2]])
    assert batch["input_ids"].shape == (3, 32)
    # equal-length lists stay one list per row, not a 2-D array
    assert batch["raw_prompt"].shape == (3,) and batch["raw_prompt"].dtype == object
    assert batch["raw_prompt"][1] == [{"role": "user", "content": "y"}]
    data = DataProto.from_single_dict(batch)
    assert len(data) == 3
    assert [rm["ground_truth"] for rm in data.non_tensor_batch["reward_model"]] == ["1", "2", "3"]
    assert isinstance(data.non_tensor_batch["index"], np.ndarray)


def test_collate_rejects_mismatched_rows():
    with pytest.raises(ValueError, match="row 1 has keys"):
        collate_fn([{"a": 1}, {"b": 1}])
    with pytest.raises(TypeError, match="mixes tensors"):
        collate_fn([{"a": torch.zeros(1)}, {"a": 1}])


def test_home_is_expanded(tokenizer, make_row, monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "d.jsonl").write_text(json.dumps(make_row("x")) + "\n")
    assert len(RLDataset("~/d.jsonl", tokenizer, max_prompt_length=32)) == 1
