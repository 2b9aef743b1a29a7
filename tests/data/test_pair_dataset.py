"""Preference-pair dataset: the reward rendering, the accepted row forms, padding, truncation, row errors.

The tiny tokenizer's ChatML template renders a turn as ``<|im_start|>{role}\\n{content}<|im_end|>\\n``
with ids im_start = 1, im_end = 2, "\\n" = 202, "user\\n" = [445, 202], "assistant\\n" = [438, 202];
expected ids below are built from those pieces, not from the template.
"""

from __future__ import annotations

import pytest
import torch

from hybridflow import fields as F
from hybridflow.data import DataFileError, DataRowError, write_rows
from hybridflow.data.pair_dataset import (
    CHOSEN_ATTENTION_MASK,
    CHOSEN_INPUT_IDS,
    REJECTED_ATTENTION_MASK,
    REJECTED_INPUT_IDS,
    PairDataset,
    render_for_reward,
)

IM_START, IM_END, NL = 1, 2, 202
HEADER = {"user": [IM_START, 445, NL], "assistant": [IM_START, 438, NL]}
PROMPT = [{"role": "user", "content": "What is 2 + 3?"}]


def turn(tokenizer, role: str, content: str) -> list[int]:
    return HEADER[role] + tokenizer.encode(content, add_special_tokens=False) + [IM_END, NL]


def pair(chosen="2 + 3 = 5", rejected="2 + 3 = 6", prompt=None) -> dict:
    return {"prompt": PROMPT if prompt is None else prompt, "chosen": chosen, "rejected": rejected}


def test_render_for_reward_is_prompt_plus_the_assistant_turn_without_a_generation_prompt(tokenizer):
    ids = render_for_reward(tokenizer, PROMPT, "5")
    assert ids == turn(tokenizer, "user", "What is 2 + 3?") + turn(tokenizer, "assistant", "5")
    assert ids[-2:] == [IM_END, NL]  # the reward is read at the template's last token, as when scoring


def test_items_hold_both_sides_right_padded_and_their_union_mask(tokenizer, write_jsonl):
    ds = PairDataset(write_jsonl("p.jsonl", [pair(rejected="I think it is 6")]), tokenizer, max_length=48)
    item = ds[0]
    chosen, rejected = ds.token_ids(0)
    assert chosen == render_for_reward(tokenizer, PROMPT, "2 + 3 = 5")
    assert rejected == render_for_reward(tokenizer, PROMPT, "I think it is 6")
    for ids_key, mask_key, ids in ((CHOSEN_INPUT_IDS, CHOSEN_ATTENTION_MASK, chosen),
                                   (REJECTED_INPUT_IDS, REJECTED_ATTENTION_MASK, rejected)):
        assert item[ids_key].shape == item[mask_key].shape == (48,)
        assert item[ids_key][: len(ids)].tolist() == ids
        assert item[ids_key][len(ids):].eq(tokenizer.pad_token_id).all()
        assert item[mask_key].tolist() == [1] * len(ids) + [0] * (48 - len(ids))
    assert item[F.ATTENTION_MASK].sum() == max(len(chosen), len(rejected))
    assert item[F.ATTENTION_MASK].dtype == torch.long


def test_string_prompts_and_trl_conversational_rows_render_alike(tokenizer, write_jsonl):
    assistant = lambda text: [{"role": "assistant", "content": text}]  # noqa: E731
    rows = [
        pair(),
        pair(prompt="What is 2 + 3?"),  # a string is one user message
        pair(chosen=assistant("2 + 3 = 5"), rejected=assistant("2 + 3 = 6")),  # TRL: explicit prompt
        {"chosen": PROMPT + assistant("2 + 3 = 5"), "rejected": PROMPT + assistant("2 + 3 = 6")},  # implicit
    ]
    ds = PairDataset(write_jsonl("p.jsonl", rows), tokenizer, max_length=64)
    assert len(ds) == 4
    assert all(ds.token_ids(i) == ds.token_ids(0) for i in range(4))


def test_configurable_columns_parquet_and_several_files(tokenizer, tmp_path):
    rows = [{"q": "What is 2 + 3?", "good": "5", "bad": "6", "extra": 1}] * 3
    a, b = write_rows(rows, tmp_path / "a.parquet"), write_rows(rows[:1], tmp_path / "b.jsonl")
    ds = PairDataset([a, b], tokenizer, prompt_key="q", chosen_key="good", rejected_key="bad", max_length=64)
    assert len(ds) == 4
    assert ds.token_ids(3) == ds.token_ids(0)


def test_identical_replies_are_allowed(tokenizer, write_jsonl):
    ds = PairDataset(write_jsonl("p.jsonl", [pair(chosen="5", rejected="5")]), tokenizer, max_length=64)
    assert ds.token_ids(0)[0] == ds.token_ids(0)[1]


def test_too_long_sides_are_refused_or_cut_from_the_left(tokenizer, write_jsonl):
    path = write_jsonl("p.jsonl", [pair(), pair(rejected="a much longer and wrong reply: six")])
    full_chosen = render_for_reward(tokenizer, PROMPT, "2 + 3 = 5")
    limit = len(full_chosen) + 2  # the first pair fits, the second row's rejected side does not
    with pytest.raises(DataRowError, match=rf"p.jsonl: row 1: field 'rejected': prompt \+ reply is \d+ tokens .* "
                                           rf"data.max_length={limit}; raise data.max_length or set data.truncation=left"):
        PairDataset(path, tokenizer, max_length=limit)
    ds = PairDataset(path, tokenizer, max_length=limit, truncation="left")
    assert ds.num_truncated == 1
    long_rejected = render_for_reward(tokenizer, PROMPT, "a much longer and wrong reply: six")
    assert ds.token_ids(1)[1] == long_rejected[-limit:]  # the prompt's start is cut, the reply kept
    assert ds[1][REJECTED_ATTENTION_MASK].all()


@pytest.mark.parametrize(
    "row, field, message",
    [
        ({"prompt": PROMPT, "rejected": "6"}, "chosen", "missing column (row has: prompt, rejected)"),
        (pair(rejected=6), "rejected", "expected the assistant reply as a string (or a list of messages "
                                       "ending with it), got int"),
        (pair(chosen=None), "chosen", "got NoneType"),
        (pair(chosen=[{"role": "user", "content": "5"}]), "chosen", "the last message must be the assistant reply"),
        (pair(chosen=[{"role": "assistant", "content": 5}]), "chosen", "message 0: 'content' must be a string"),
        (pair(prompt=""), "prompt", "empty prompt"),
        (pair(prompt=[{"content": "hi"}]), "prompt", "message 0: 'role' must be a non-empty string"),
        ({"chosen": "5", "rejected": "6"}, "prompt", "missing column (row has: chosen, rejected)"),
        ({"chosen": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "5"}],
          "rejected": [{"role": "user", "content": "b"}, {"role": "assistant", "content": "6"}]},
         "prompt", "the messages before the replies in 'chosen' and 'rejected' differ"),
    ],
)
def test_malformed_rows_name_the_file_row_and_column(tokenizer, write_jsonl, row, field, message):
    path = write_jsonl("bad.jsonl", [pair(), row])
    with pytest.raises(DataRowError) as err:
        PairDataset(path, tokenizer, max_length=64)
    assert (err.value.file, err.value.row_index, err.value.field) == (str(path), 1, field)
    assert message in str(err.value)
    assert str(err.value).startswith(f"{path}: row 1: field '{field}': ")


def test_empty_and_missing_files_are_input_errors(tokenizer, tmp_path):
    (tmp_path / "empty.jsonl").write_text("")
    with pytest.raises(DataFileError, match="no rows in"):
        PairDataset(tmp_path / "empty.jsonl", tokenizer)
    with pytest.raises(DataFileError, match="data file not found"):
        PairDataset(tmp_path / "nope.parquet", tokenizer)
