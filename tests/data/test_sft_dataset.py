"""SFT dataset: chat templating, the assistant-only loss mask, truncation and row errors.

The tiny tokenizer's ChatML template renders a turn as ``<|im_start|>{role}\\n{content}<|im_end|>\\n``
with ids im_start = 1, im_end = 2 (the eos), "\\n" = 202, "system\\n" = [478, 202],
"user\\n" = [445, 202], "assistant\\n" = [438, 202]; expected ids below are built from those
pieces, not from the template.
"""

from __future__ import annotations

import pytest
import torch

from hybridflow.data import DataRowError
from hybridflow.data.sft_dataset import (
    LOSS_MASK,
    ChatTemplateError,
    SFTDataset,
    right_pad,
    tokenize_conversation,
    truncate_example,
)

IM_START, IM_END, NL = 1, 2, 202
HEADER = {"system": [IM_START, 478, NL], "user": [IM_START, 445, NL], "assistant": [IM_START, 438, NL]}


def enc(tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False)


def turn(tokenizer, role: str, content: str) -> list[int]:
    return HEADER[role] + enc(tokenizer, content) + [IM_END, NL]


MULTI_TURN = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Hi"},
    {"role": "assistant", "content": "A1"},
    {"role": "user", "content": "ok"},
    {"role": "assistant", "content": "B2"},
]


def test_multi_turn_mask_covers_exactly_the_assistant_replies_and_their_eos(tokenizer):
    ids, mask = tokenize_conversation(tokenizer, MULTI_TURN)
    expected = [t for m in MULTI_TURN for t in turn(tokenizer, m["role"], m["content"])]
    assert ids == expected
    assert ids == tokenizer.apply_chat_template(MULTI_TURN, tokenize=True)["input_ids"]
    # system 0-11 (7 content tokens), user 12-18, assistant header 19-21, "A1" 22-23, im_end 24,
    # "\n" 25, user 26-32, assistant header 33-35, "B2" 36-37, im_end 38, "\n" 39
    assert len(ids) == 40
    assert [i for i, m in enumerate(mask) if m] == [22, 23, 24, 36, 37, 38]
    assert [ids[i] for i in (24, 38)] == [IM_END, IM_END]
    assert tokenizer.decode([t for t, m in zip(ids, mask) if m]) == "A1<|im_end|>B2<|im_end|>"


def test_first_trained_leaves_earlier_assistant_turns_as_context(tokenizer):
    _, mask = tokenize_conversation(tokenizer, MULTI_TURN, first_trained=3)
    assert [i for i, m in enumerate(mask) if m] == [36, 37, 38]


def test_single_turn_prompt_is_tokenized_exactly_as_at_inference(tokenizer, write_jsonl):
    path = write_jsonl("sft.jsonl", [{"prompt": "What is 7 + 5?", "response": "12"}])
    ds = SFTDataset(path, tokenizer, max_length=32)
    ids, mask = ds.token_ids(0)
    prompt_text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is 7 + 5?"}], add_generation_prompt=True, tokenize=False
    )
    prompt_ids = enc(tokenizer, prompt_text)
    assert ids[: len(prompt_ids)] == prompt_ids  # the RL prompt, token for token
    assert ids[len(prompt_ids) :] == enc(tokenizer, "12") + [IM_END, NL]
    assert mask == [0] * len(prompt_ids) + [1, 1, 1, 0]


def test_prompt_as_messages_with_a_few_shot_turn_trains_only_the_response(tokenizer, write_jsonl):
    prompt = [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "A1"},
        {"role": "user", "content": "ok"},
    ]
    path = write_jsonl("sft.jsonl", [{"q": prompt, "a": "B2"}])
    ds = SFTDataset(path, tokenizer, prompt_key="q", response_key="a", max_length=64)
    ids, mask = ds.token_ids(0)
    expected = turn(tokenizer, "user", "Hi") + turn(tokenizer, "assistant", "A1") + turn(tokenizer, "user", "ok")
    expected += turn(tokenizer, "assistant", "B2")
    assert ids == expected
    assert tokenizer.decode([t for t, m in zip(ids, mask) if m]) == "B2<|im_end|>"


def test_items_are_right_padded_tensors(tokenizer, write_jsonl):
    path = write_jsonl("sft.jsonl", [{"prompt": "Hi", "response": "ok"}])
    ds = SFTDataset(path, tokenizer, max_length=16)
    item = ds[0]
    n = len(ds.token_ids(0)[0])  # user turn 7 + header 3 + "ok" 2 + im_end + "\n" = 14
    assert n == 14
    assert item["input_ids"].shape == (16,)
    assert item["input_ids"][n:].tolist() == [tokenizer.pad_token_id] * 2
    assert item["attention_mask"].tolist() == [1] * n + [0, 0]
    assert item["position_ids"].tolist() == list(range(n)) + [n - 1, n - 1]
    assert item[LOSS_MASK].tolist() == [0] * 10 + [1, 1, 1, 0, 0, 0]


def test_multiturn_rows_from_parquet(tokenizer, tmp_path):
    from hybridflow.data import write_rows

    path = write_rows([{"messages": MULTI_TURN}, {"messages": MULTI_TURN[1:3]}], tmp_path / "chats.parquet")
    ds = SFTDataset(path, tokenizer, messages_key="messages", max_length=64)
    assert len(ds) == 2
    assert ds.token_ids(0) == tokenize_conversation(tokenizer, MULTI_TURN)
    _, mask = ds.token_ids(1)
    assert sum(mask) == 3  # "A1" + im_end


def test_truncate_example():
    ids, mask = list(range(10)), [0, 0, 0, 0, 0, 1, 1, 1, 1, 0]
    assert truncate_example(ids, mask, 4, "right") == ([0, 1, 2, 3], [0, 0, 0, 0])
    # left keeps the end; its new first token has nothing to predict it from
    assert truncate_example(ids, mask, 4, "left") == ([6, 7, 8, 9], [0, 1, 1, 0])
    assert truncate_example(ids, mask, 10, "error") == (ids, mask)
    with pytest.raises(ValueError, match="more than max_length=4"):
        truncate_example(ids, mask, 4, "error")
    with pytest.raises(ValueError, match="unknown truncation mode 'middle'"):
        truncate_example(ids, mask, 4, "middle")


def test_overlong_example_error_names_file_row_and_field(tokenizer, write_jsonl):
    rows = [{"prompt": "Hi", "response": "ok"}, {"prompt": "Hi", "response": "ok " * 40}]
    path = write_jsonl("long.jsonl", rows)
    with pytest.raises(DataRowError) as err:
        SFTDataset(path, tokenizer, max_length=32)
    assert (err.value.file, err.value.row_index, err.value.field) == (str(path), 1, "response")
    assert "more than data.max_length=32" in str(err.value)


def test_truncation_left_and_right(tokenizer, write_jsonl):
    path = write_jsonl("long.jsonl", [{"prompt": "Hi " * 20, "response": "ok"}])
    left = SFTDataset(path, tokenizer, max_length=12, truncation="left")
    ids, mask = left.token_ids(0)
    assert len(ids) == 12 and left.num_truncated == 1
    assert tokenizer.decode([t for t, m in zip(ids, mask) if m]) == "ok<|im_end|>"
    with pytest.raises(DataRowError, match="no assistant token is left"):
        SFTDataset(path, tokenizer, max_length=12, truncation="right")


@pytest.mark.parametrize(
    ("row", "field", "problem"),
    [
        ({"prompt": "Hi"}, "response", "missing column"),
        ({"prompt": "Hi", "response": 3}, "response", "expected a string, got int"),
        ({"prompt": "  ", "response": "ok"}, "prompt", "empty prompt"),
        ({"prompt": [{"role": "user"}], "response": "ok"}, "prompt", "'content' must be a string"),
        ({"prompt": 5, "response": "ok"}, "prompt", "expected a non-empty list"),
    ],
)
def test_malformed_single_turn_rows(tokenizer, write_jsonl, row, field, problem):
    path = write_jsonl("bad.jsonl", [{"prompt": "Hi", "response": "ok"}, row])
    with pytest.raises(DataRowError, match=problem) as err:
        SFTDataset(path, tokenizer, max_length=64)
    assert (err.value.row_index, err.value.field) == (1, field)


@pytest.mark.parametrize(
    ("messages", "problem"),
    [
        ([{"role": "user", "content": "Hi"}], "no assistant message"),
        ([{"role": "assistant", "content": "A1"}], "starts with an assistant message"),
        ([{"role": "", "content": "x"}], "'role' must be a non-empty string"),
        ([], "expected a non-empty list"),
    ],
)
def test_malformed_conversations(tokenizer, write_jsonl, messages, problem):
    path = write_jsonl("bad.jsonl", [{"messages": messages}])
    with pytest.raises(DataRowError, match=problem) as err:
        SFTDataset(path, tokenizer, messages_key="messages", max_length=64)
    assert (err.value.row_index, err.value.field) == (0, "messages")


def test_template_that_rewrites_earlier_turns_is_reported(tokenizer):
    from hybridflow.models.tiny import build_tiny_tokenizer

    odd = build_tiny_tokenizer()
    # renders only the last message: later renders do not extend earlier ones
    odd.chat_template = "{{ messages[-1]['content'] }}{% if add_generation_prompt %}>{% endif %}"
    with pytest.raises(ChatTemplateError, match="does not render message 1 as an extension"):
        tokenize_conversation(odd, MULTI_TURN[1:3])


def test_constructor_checks(tokenizer, write_jsonl):
    path = write_jsonl("sft.jsonl", [{"prompt": "Hi", "response": "ok"}])
    with pytest.raises(ValueError, match="truncation must be one of"):
        SFTDataset(path, tokenizer, truncation="middle")
    with pytest.raises(ValueError, match="max_length must be an integer"):
        SFTDataset(path, tokenizer, max_length=1)


def test_right_pad_rejects_overflow():
    with pytest.raises(ValueError, match="do not fit"):
        right_pad([1, 2, 3], [0, 1, 1], 2, 0)
    out = right_pad([5, 6], [0, 1], 3, 9)
    assert torch.equal(out["input_ids"], torch.tensor([5, 6, 9]))


def test_arithmetic_sft_task_adds_worked_answers_the_reward_accepts(tmp_path):
    from hybridflow.data import read_rows
    from hybridflow.data.tasks import TASKS
    from hybridflow.data.tasks.arithmetic_sft import worked_answer
    from hybridflow.entrypoints.data import main as data_main
    from hybridflow.reward import default_compute_score

    assert worked_answer("23 + 45", "68") == "23 + 45 = 68\n#### 68"
    assert data_main(["arithmetic-sft", "--out", str(tmp_path / "sft"), "--train-size", "6", "--test-size", "3"]) == 0
    assert data_main(["arithmetic", "--out", str(tmp_path / "rl"), "--train-size", "6", "--test-size", "3"]) == 0
    sft, rl = read_rows(tmp_path / "sft" / "train.parquet"), read_rows(tmp_path / "rl" / "train.parquet")
    assert [{k: v for k, v in row.items() if k != "response"} for row in sft] == rl  # same problems, same prompts
    for row in sft:
        extra = row["extra_info"]
        assert row["response"] == f"{extra['expression']} = {extra['answer']}\n#### {extra['answer']}"
        score = default_compute_score(row["data_source"], row["response"], row["reward_model"]["ground_truth"], extra)
        assert score["score"] == 1.0
    assert "arithmetic-sft" in TASKS
