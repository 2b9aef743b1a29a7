from __future__ import annotations

import pytest

from hybridflow.data.rl_dataset import RLDataset
from hybridflow.data.schema import DataRowError, validate_rl_row


def _check(row, match):
    with pytest.raises(DataRowError, match=match):
        validate_rl_row(row, file="f.jsonl", row_index=7)


def test_valid_row_is_normalised(make_row):
    row = make_row("What is 1 + 1?", "2", index=42)
    row["prompt"][0]["tool_calls"] = None  # parquet fills absent struct keys with None
    parsed = validate_rl_row(row, file="f.jsonl", row_index=3)
    assert parsed.index == 42
    assert parsed.messages == [{"role": "user", "content": "What is 1 + 1?"}]
    assert parsed.reward_model == {"style": "rule", "ground_truth": "2"}
    assert parsed.data_source == "hybridflow/arithmetic"


def test_index_defaults_to_row_number(make_row):
    row = make_row("q")
    del row["extra_info"]
    parsed = validate_rl_row(row, file="f.jsonl", row_index=5)
    assert (parsed.index, parsed.extra_info, ) == (5, {})


def test_missing_column(make_row):
    row = make_row("q")
    del row["reward_model"]
    _check(row, r"f.jsonl: row 7: field 'reward_model': missing column")


@pytest.mark.parametrize(
    "prompt, problem",
    [
        ("What is 2?", "plain string"),
        (42, "got int"),
        ([], "empty prompt"),
        ([{"role": "user", "content": "   "}], "blank"),
        ([{"role": "user"}], "'content' must be a string"),
        ([{"content": "hi"}], "'role' must be a non-empty string"),
        (["hi"], "message 0: expected a dict"),
    ],
)
def test_bad_prompts(make_row, prompt, problem):
    row = make_row("q")
    row["prompt"] = prompt
    _check(row, rf"f.jsonl: row 7: field 'prompt': .*{problem}")


def test_bad_data_source(make_row):
    row = make_row("q")
    row["data_source"] = ""
    _check(row, "field 'data_source': expected a non-empty string")


@pytest.mark.parametrize(
    "reward_model, problem",
    [("2", "expected a dict"), ({"style": "rule"}, "missing key 'ground_truth'"),
     ({"style": "rule", "ground_truth": None}, "is null"), ({"style": "oops", "ground_truth": "1"}, "'style' must be")],
)
def test_bad_reward_model(make_row, reward_model, problem):
    row = make_row("q")
    row["reward_model"] = reward_model
    _check(row, rf"field 'reward_model': .*{problem}")


def test_model_style_may_omit_ground_truth(make_row):
    row = make_row("q")
    row["reward_model"] = {"style": "model", "ground_truth": None}
    assert validate_rl_row(row, file="f", row_index=0).reward_model["ground_truth"] is None


def test_bad_extra_info_and_index(make_row):
    row = make_row("q")
    row["extra_info"] = "x"
    _check(row, "field 'extra_info': expected a dict, got str")
    row["extra_info"] = {"index": "3"}
    _check(row, r"field 'extra_info.index': expected an integer")


def test_dataset_reports_file_row_and_field(tokenizer, write_jsonl, make_row):
    rows = [make_row("a"), make_row("b"), make_row("c")]
    rows[2]["prompt"] = []
    path = write_jsonl("train.jsonl", rows)
    with pytest.raises(DataRowError) as info:
        RLDataset(path, tokenizer, max_prompt_length=64)
    assert str(path) in str(info.value)
    assert (info.value.row_index, info.value.field) == (2, "prompt")


def test_custom_prompt_key(tokenizer, write_jsonl, make_row):
    row = make_row("a")
    row["question"] = row.pop("prompt")
    path = write_jsonl("q.jsonl", [row])
    with pytest.raises(DataRowError, match="field 'prompt': missing column"):
        RLDataset(path, tokenizer, max_prompt_length=64)
    assert len(RLDataset(path, tokenizer, prompt_key="question", max_prompt_length=64)) == 1
