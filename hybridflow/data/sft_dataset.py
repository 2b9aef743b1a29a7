"""The SFT dataset: prompt/response rows or multi-turn conversations → chat-templated token ids
with a loss mask that covers only what the assistant says.

Rows (parquet or JSON lines) come in one of two shapes:

* single turn: ``{prompt_key: str | [messages], response_key: str, ...}`` — a string prompt is
  one user message; a list of ``{role, content}`` messages is used as is (few-shot assistant
  turns inside it are context, not trained on); the response becomes the final assistant turn;
* multi-turn: ``{messages_key: [messages]}`` — every assistant turn is trained on. With
  ``tools_key``, a row's tool schemas (a list of OpenAI function schemas, or that list as a JSON
  string; null = no tools) go to the template as ``tools=``, and ``tool_prompt`` (given by the
  SFT trainer: the tool agent's rule) may first describe them in the system message, so a
  conversation is rendered exactly as the agent loop renders it at RL time.

How the loss mask is built (:func:`tokenize_conversation`): the conversation is rendered with
the tokenizer's chat template one message at a time. For an assistant message at index k the
text between ``template(messages[:k], add_generation_prompt=True)`` and
``template(messages[:k+1])`` is what the model has to generate — the reply and its end-of-turn
token. Those tokens get mask 1, up to and including the first EOS; the role header before them
and any template text after the EOS (ChatML's trailing newline) get 0, as do system, user and
tool turns. Each rendered prefix must extend the previous one; a template that rewrites earlier
turns (e.g. one that strips past reasoning) is reported instead of silently mis-masked.

``ds[i]`` holds right-padded long tensors of length ``max_length``: ``input_ids``,
``attention_mask``, ``position_ids`` and ``loss_mask`` (aligned with the tokens: ``loss_mask[t]``
= 1 when token t is a target; position 0 is never a target, nothing predicts it).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import torch
from torch.utils.data import Dataset

from hybridflow import fields as F
from hybridflow.data.dataset_args import as_file_list, check_chat_dataset_args
from hybridflow.data.io import DataFileError, read_rows
from hybridflow.data.schema import DataRowError, check_message_dicts
from hybridflow.utils.errors import InputError

LOSS_MASK = "loss_mask"
ToolPrompt = Callable[[list[dict[str, Any]], list[dict[str, Any]]], list[dict[str, Any]]]
"""``(messages, tool schemas) → messages`` to render (e.g. with the tools described in the system message)."""
SFT_TRUNCATION_MODES: tuple[str, ...] = ("error", "left", "right")
ASSISTANT = "assistant"


class ChatTemplateError(InputError, ValueError):
    """The chat template cannot be rendered turn by turn (see the module docstring)."""


def _render(tokenizer: Any, messages: list[dict[str, Any]], generation_prompt: bool, kwargs: dict[str, Any]) -> str:
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt, **kwargs)


def _encode(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"]) if text else []


def _target_mask(ids: list[int], eos_token_id: int | None) -> list[int]:
    """1 up to and including the first EOS of an assistant segment, 0 after it."""
    if eos_token_id is None or eos_token_id not in ids:
        return [1] * len(ids)
    cut = ids.index(eos_token_id) + 1
    return [1] * cut + [0] * (len(ids) - cut)


def tokenize_conversation(
    tokenizer: Any,
    messages: list[dict[str, Any]],
    first_trained: int = 0,
    chat_template_kwargs: dict[str, Any] | None = None,
    tools: list[dict[str, Any]] | None = None,
) -> tuple[list[int], list[int]]:
    """``(input_ids, loss_mask)`` of a chat-templated conversation (rules: module docstring).

    Only assistant messages at index ≥ ``first_trained`` get loss; ``tools`` go to every
    rendering as the template's ``tools`` argument. Raises
    :class:`ChatTemplateError` when the template renders a prefix that a later render does not
    extend, or when an assistant message comes first (there is no prompt to generate it from).
    """
    kwargs = dict(chat_template_kwargs or {})
    if tools:
        kwargs["tools"] = tools
    ids: list[int] = []
    mask: list[int] = []
    rendered = ""
    for k, message in enumerate(messages):
        trained = message["role"] == ASSISTANT and k >= first_trained
        if trained and k == 0:
            raise ChatTemplateError("the conversation starts with an assistant message; there is no prompt for it")
        cut_points = [_render(tokenizer, messages[:k], True, kwargs)] if trained else []
        cut_points.append(_render(tokenizer, messages[: k + 1], False, kwargs))
        for j, text in enumerate(cut_points):
            if not text.startswith(rendered):
                raise ChatTemplateError(
                    f"the chat template does not render message {k} as an extension of the messages before it, "
                    "so the assistant tokens cannot be located; use a template that renders turns incrementally "
                    "(model.custom_chat_template)"
                )
            segment = _encode(tokenizer, text[len(rendered) :])
            is_reply = trained and j == len(cut_points) - 1
            ids += segment
            mask += _target_mask(segment, tokenizer.eos_token_id) if is_reply else [0] * len(segment)
            rendered = text
    if mask:
        mask[0] = 0  # nothing predicts the first token
    return ids, mask


def truncate_example(ids: list[int], mask: list[int], max_length: int, mode: str) -> tuple[list[int], list[int]]:
    """Cut to ``max_length`` tokens: ``left`` keeps the last ones, ``right`` the first; ``error`` raises."""
    if mode not in SFT_TRUNCATION_MODES:
        raise ValueError(f"unknown truncation mode {mode!r}; valid: {', '.join(SFT_TRUNCATION_MODES)}")
    if len(ids) <= max_length:
        return list(ids), list(mask)
    if mode == "left":
        ids, mask = list(ids[-max_length:]), list(mask[-max_length:])
        mask[0] = 0  # the new first token has no predecessor
        return ids, mask
    if mode == "right":
        return list(ids[:max_length]), list(mask[:max_length])
    raise ValueError(f"example has {len(ids)} tokens, more than max_length={max_length} (truncation='error')")


def right_pad(ids: list[int], mask: list[int], length: int, pad_token_id: int) -> dict[str, torch.Tensor]:
    """Right-pad one example to ``length``: ``input_ids``, ``attention_mask``, ``position_ids``, ``loss_mask``.

    Position ids count real tokens (0 … n−1) and stay at n−1 over the padding.
    """
    if len(ids) > length:
        raise ValueError(f"{len(ids)} ids do not fit in length {length}")
    pad = length - len(ids)
    attention_mask = torch.tensor([1] * len(ids) + [0] * pad, dtype=torch.long)
    return {
        F.INPUT_IDS: torch.tensor(list(ids) + [pad_token_id] * pad, dtype=torch.long),
        F.ATTENTION_MASK: attention_mask,
        F.POSITION_IDS: torch.clamp(torch.cumsum(attention_mask, dim=0) - 1, min=0),
        LOSS_MASK: torch.tensor(list(mask) + [0] * pad, dtype=torch.long),
    }


def check_messages(value: Any, fail: Callable[[str], Exception]) -> list[dict[str, Any]]:
    """``value`` as a list of ``{role, content, ...}`` chat messages, keys whose value is None dropped;
    ``fail(message)`` builds the error raised for a malformed one (it names the file, row and column).
    Shared by the SFT and the preference-pair datasets, so both accept the same message rows."""
    if not isinstance(value, (list, tuple)) or not value:
        raise fail(f"expected a non-empty list of {{role, content}} chat messages, got {value!r:.80}")
    return check_message_dicts(value, fail)


class SFTDataset(Dataset):
    """Supervised examples from parquet / JSON-lines files, tokenized once at construction.

    Args:
        files: one path or a list (``~`` is expanded); rows are concatenated in order.
        tokenizer: a Hugging Face tokenizer with a chat template.
        prompt_key / response_key: columns of single-turn rows.
        messages_key: set to read multi-turn rows from this column instead.
        tools_key: with ``messages_key``, the column of each row's tool schemas (absent or null:
            no tools).
        tool_prompt: applied to a row's messages when it has tools (see the module docstring).
        max_length: examples are right-padded to exactly this many tokens.
        truncation: a longer example raises (``error``, at construction, naming file and row) or
            keeps its last (``left``) / first (``right``) ``max_length`` tokens.
        chat_template_kwargs: extra keyword arguments for ``apply_chat_template``.

    Every malformed row raises :class:`~hybridflow.data.schema.DataRowError` naming the file,
    the 0-based row index and the field. ``num_truncated`` counts the examples that were cut.
    """

    def __init__(
        self,
        files: str | os.PathLike | Sequence[str | os.PathLike],
        tokenizer: Any,
        *,
        prompt_key: str = "prompt",
        response_key: str = "response",
        messages_key: str | None = None,
        tools_key: str | None = None,
        tool_prompt: ToolPrompt | None = None,
        max_length: int = 1024,
        truncation: str = "error",
        chat_template_kwargs: dict[str, Any] | None = None,
    ) -> None:
        pad = check_chat_dataset_args(
            tokenizer, truncation, SFT_TRUNCATION_MODES, max_length, "SFT examples", "examples"
        )
        self.files = as_file_list(files, "SFTDataset")
        self.tokenizer = tokenizer
        self.prompt_key, self.response_key, self.messages_key = prompt_key, response_key, messages_key
        self.tools_key, self.tool_prompt = tools_key, tool_prompt
        self.max_length = max_length
        self.truncation = truncation
        self.pad_token_id = int(pad)
        self._kwargs = dict(chat_template_kwargs or {})
        self.num_truncated = 0
        self._examples: list[tuple[list[int], list[int]]] = []
        for file in self.files:
            for i, row in enumerate(read_rows(file)):
                self._examples.append(self._example(row, file, i))
        if not self._examples:
            raise DataFileError(f"no rows in {', '.join(self.files)}")

    def _tools(self, row: dict[str, Any], file: str, index: int) -> list[dict[str, Any]] | None:
        """The row's tool schemas, or None."""
        if self.messages_key is None or self.tools_key is None or row.get(self.tools_key) is None:
            return None
        value = row[self.tools_key]
        fail = partial(DataRowError, file, index, self.tools_key)
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except json.JSONDecodeError as exc:
                raise fail(f"not valid JSON ({exc.msg})") from None
        if not isinstance(value, (list, tuple)) or not all(isinstance(t, dict) for t in value):
            raise fail(f"expected a list of tool schemas (JSON objects), got {value!r:.80}")
        return [_drop_nulls(t) for t in value] or None

    def _conversation(self, row: dict[str, Any], file: str, index: int) -> tuple[list[dict[str, Any]], int, str]:
        """``(messages, first_trained, field)`` of one row."""
        keys = [self.messages_key] if self.messages_key is not None else [self.prompt_key, self.response_key]
        for key in keys:
            if key not in row:
                raise DataRowError(file, index, key, f"missing column (row has: {', '.join(sorted(row)) or 'nothing'})")
        if self.messages_key is not None:
            fail = partial(DataRowError, file, index, self.messages_key)
            messages = check_messages(row[self.messages_key], fail)
            if not any(m["role"] == ASSISTANT for m in messages):
                raise fail("no assistant message: nothing to train on")
            return messages, 0, self.messages_key
        prompt = row[self.prompt_key]
        fail = partial(DataRowError, file, index, self.prompt_key)
        if isinstance(prompt, str):
            if not prompt.strip():
                raise fail("empty prompt")
            prompt_messages = [{"role": "user", "content": prompt}]
        else:
            prompt_messages = check_messages(prompt, fail)
        response = row[self.response_key]
        if not isinstance(response, str):
            raise DataRowError(file, index, self.response_key, f"expected a string, got {type(response).__name__}")
        messages = prompt_messages + [{"role": ASSISTANT, "content": response}]
        return messages, len(prompt_messages), self.response_key

    def _example(self, row: dict[str, Any], file: str, index: int) -> tuple[list[int], list[int]]:
        messages, first_trained, field = self._conversation(row, file, index)
        tools = self._tools(row, file, index)
        if tools and self.tool_prompt is not None:
            before = len(messages)
            messages = self.tool_prompt(messages, tools)
            first_trained += len(messages) - before  # a system message may have been added
        try:
            ids, mask = tokenize_conversation(self.tokenizer, messages, first_trained, self._kwargs, tools)
        except ChatTemplateError as err:
            raise DataRowError(file, index, field, str(err)) from None
        if len(ids) > self.max_length:
            if self.truncation == "error":
                raise DataRowError(
                    file,
                    index,
                    field,
                    f"example is {len(ids)} tokens after the chat template, more than data.max_length="
                    f"{self.max_length}; raise data.max_length or set data.truncation to left/right",
                )
            self.num_truncated += 1
            ids, mask = truncate_example(ids, mask, self.max_length, self.truncation)
        if not any(mask):
            raise DataRowError(
                file,
                index,
                field,
                f"no assistant token is left to train on within data.max_length={self.max_length} "
                f"(truncation={self.truncation!r})",
            )
        return ids, mask

    def __len__(self) -> int:
        return len(self._examples)

    def __getitem__(self, item: int) -> dict[str, torch.Tensor]:
        ids, mask = self._examples[item]
        return right_pad(ids, mask, self.max_length, self.pad_token_id)

    def token_ids(self, item: int) -> tuple[list[int], list[int]]:
        """The unpadded ``(input_ids, loss_mask)`` of example ``item``."""
        ids, mask = self._examples[item]
        return list(ids), list(mask)


def _drop_nulls(value: Any) -> Any:
    """``value`` without the None entries parquet adds for keys a struct row lacks."""
    if isinstance(value, dict):
        return {k: _drop_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_drop_nulls(v) for v in value]
    return value
