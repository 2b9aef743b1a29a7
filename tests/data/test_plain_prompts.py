"""Prompts without a chat template (``data.apply_chat_template=false``): base models such as
Gemma 3 270M read the prompt's text as it is, with the tokenizer's own special tokens."""

from __future__ import annotations

import copy

import pytest
from tokenizers import processors

from hybridflow.config import load_config
from hybridflow.data import RLDataset
from hybridflow.data.prompt_text import plain_prompt_text, prompt_token_ids, require_chat_template
from hybridflow.data.schema import DataRowError
from hybridflow.utils.errors import InputError


@pytest.fixture(scope="module")
def base_tokenizer(tokenizer):
    """The tiny tokenizer made to look like a base model's: no chat template, and a BOS token
    put in front of every encoded text (as Gemma's tokenizer does)."""
    base = copy.deepcopy(tokenizer)
    base.chat_template = None
    bos = base.bos_token
    base.backend_tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, base.bos_token_id)]
    )
    base.name_or_path = "/models/tiny-base"
    return base


def test_plain_prompt_is_the_tokenizers_encoding_of_the_text(base_tokenizer, write_jsonl, make_row) -> None:
    path = write_jsonl("t.jsonl", [make_row("What is 12 + 35? Answer:", "47", index=3)])
    ds = RLDataset(path, base_tokenizer, max_prompt_length=40, apply_chat_template=False)
    expected = base_tokenizer("What is 12 + 35? Answer:")["input_ids"]
    assert expected[0] == base_tokenizer.bos_token_id  # the tokenizer's own special token is kept
    assert ds[0]["raw_prompt_ids"] == expected
    n_pad = 40 - len(expected)
    assert ds[0]["input_ids"].tolist() == [base_tokenizer.pad_token_id] * n_pad + expected
    assert ds[0]["attention_mask"].tolist() == [0] * n_pad + [1] * len(expected)


def test_messages_are_joined_by_a_blank_line(base_tokenizer, write_jsonl, make_row) -> None:
    row = make_row("What is 2 + 3?")
    row["prompt"] = [{"role": "system", "content": "Answer with a number."}, *row["prompt"]]
    ds = RLDataset(write_jsonl("t.jsonl", [row]), base_tokenizer, max_prompt_length=40, apply_chat_template=False)
    text = "Answer with a number.\n\nWhat is 2 + 3?"
    assert plain_prompt_text(row["prompt"]) == text
    assert ds[0]["raw_prompt_ids"] == base_tokenizer(text)["input_ids"]


def test_plain_string_prompt_column(base_tokenizer, tokenizer, write_jsonl, make_row) -> None:
    row = make_row("unused")
    row["prompt"] = "Q: 7 + 5 =\nA:"
    path = write_jsonl("t.jsonl", [row])
    ds = RLDataset(path, base_tokenizer, max_prompt_length=40, apply_chat_template=False, return_raw_chat=True)
    assert ds[0]["raw_prompt_ids"] == base_tokenizer("Q: 7 + 5 =\nA:")["input_ids"]
    assert ds[0]["raw_prompt"] == [{"role": "user", "content": "Q: 7 + 5 =\nA:"}]
    with pytest.raises(DataRowError, match=r"got a plain string \(plain-string prompts are read with "):
        RLDataset(path, tokenizer, max_prompt_length=40)  # templated prompts must be messages


def test_switch_off_ignores_an_existing_template(tokenizer, write_jsonl, make_row) -> None:
    path = write_jsonl("t.jsonl", [make_row("hi there")])
    plain = RLDataset(path, tokenizer, max_prompt_length=40, apply_chat_template=False)
    templated = RLDataset(path, tokenizer, max_prompt_length=40)
    assert plain[0]["raw_prompt_ids"] == tokenizer("hi there")["input_ids"]
    assert len(templated[0]["raw_prompt_ids"]) > len(plain[0]["raw_prompt_ids"])


def test_template_less_tokenizer_with_the_switch_on_names_the_model(base_tokenizer, write_jsonl, make_row) -> None:
    path = write_jsonl("t.jsonl", [make_row("x")])
    with pytest.raises(ValueError) as err:
        RLDataset(path, base_tokenizer, max_prompt_length=40)
    assert str(err.value).startswith("the tokenizer of /models/tiny-base has no chat template (a base model?)")
    assert isinstance(err.value, InputError)  # the command line prints it without a traceback
    assert "set data.apply_chat_template=false" in str(err.value)
    require_chat_template(_with_template(base_tokenizer))  # a template, however given, satisfies it


def _with_template(tokenizer):
    templated = copy.deepcopy(tokenizer)
    templated.chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    return templated


def test_over_long_plain_prompt_is_reported_after_tokenization(base_tokenizer, write_jsonl, make_row) -> None:
    path = write_jsonl("t.jsonl", [make_row("What is 12 + 35? Answer:")])
    with pytest.raises(DataRowError, match=r"tokens after tokenization, more than max_prompt_length=3"):
        RLDataset(path, base_tokenizer, max_prompt_length=3, apply_chat_template=False)


def test_prompt_token_ids_templated_matches_the_chat_template(tokenizer) -> None:
    messages = [{"role": "user", "content": "What is 2 + 3?"}]
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert prompt_token_ids(tokenizer, [messages]) == [tokenizer(text, add_special_tokens=False)["input_ids"]]


def test_config_key() -> None:
    assert load_config().data.apply_chat_template is True
    assert load_config(overrides=["data.apply_chat_template=false"]).data.apply_chat_template is False
