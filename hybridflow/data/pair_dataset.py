"""Preference pairs for reward-model training: ``(prompt, chosen, rejected)`` rows → token ids.

Rows (parquet or JSON lines, read by :mod:`hybridflow.data.io`) hold three columns, names
configurable:

* ``prompt``: chat messages (``[{"role": "user", "content": ...}]``) or a string (one user message);
* ``chosen`` / ``rejected``: the preferred and the dispreferred assistant reply, as a string, or
  in TRL's conversational form: a list of messages whose last is the assistant turn. Messages
  before it are appended to the prompt; without a ``prompt`` column they *are* the prompt
  (TRL's implicit-prompt form) and must be the same on both sides.

Each side is rendered by :func:`render_for_reward`: the chat template over prompt + assistant
turn with ``add_generation_prompt=False``. That is exactly how a reward model scores a policy
response later (the RL reward worker calls the same function), so training and scoring see the
same tokens and the reward is read at the same position (the last templated token).

``ds[i]`` holds right-padded long tensors of length ``max_length``: ``chosen_input_ids``,
``chosen_attention_mask``, ``rejected_input_ids``, ``rejected_attention_mask`` and
``attention_mask`` — the union of the two masks (the pair's longer side), which is what the
training engine sorts and splits micro-batches by.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from functools import partial
from typing import Any

import torch
from torch.utils.data import Dataset

from hybridflow import fields as F
from hybridflow.data.dataset_args import as_file_list, check_chat_dataset_args
from hybridflow.data.io import DataFileError, read_rows
from hybridflow.data.schema import DataRowError
from hybridflow.data.sft_dataset import check_messages

CHOSEN_INPUT_IDS = "chosen_input_ids"
CHOSEN_ATTENTION_MASK = "chosen_attention_mask"
REJECTED_INPUT_IDS = "rejected_input_ids"
REJECTED_ATTENTION_MASK = "rejected_attention_mask"
PAIR_TRUNCATION_MODES: tuple[str, ...] = ("error", "left")
ASSISTANT = "assistant"

Messages = list[dict[str, Any]]


def render_for_reward(tokenizer: Any, messages: Messages, response: str) -> list[int]:
    """Token ids of ``messages`` + the assistant turn ``response``, chat-templated with
    ``add_generation_prompt=False`` (the one rendering a reward model is trained and scored on)."""
    conversation = [*messages, {"role": ASSISTANT, "content": response}]
    text = tokenizer.apply_chat_template(conversation, tokenize=False, add_generation_prompt=False)
    # the template writes any BOS itself; the tokenizer must not add a second one
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def _pad(ids: list[int], length: int, pad_token_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    pad = length - len(ids)
    return (
        torch.tensor(ids + [pad_token_id] * pad, dtype=torch.long),
        torch.tensor([1] * len(ids) + [0] * pad, dtype=torch.long),
    )


class PairDataset(Dataset):
    """Preference pairs from parquet / JSON-lines files, tokenized once at construction.

    Args:
        files: one path or a list (``~`` is expanded); rows are concatenated in order.
        tokenizer: a Hugging Face tokenizer with a chat template.
        prompt_key / chosen_key / rejected_key: the three columns (see the module docstring).
        max_length: each side is right-padded to exactly this many tokens.
        truncation: a longer side raises (``error``, at construction) or keeps its last
            ``max_length`` tokens (``left``: the start of the prompt is cut, the reply kept).

    A malformed row raises :class:`~hybridflow.data.schema.DataRowError` naming the file, the
    0-based row index and the column. ``num_truncated`` counts the sides that were cut.
    """

    def __init__(
        self,
        files: str | os.PathLike | Sequence[str | os.PathLike],
        tokenizer: Any,
        *,
        prompt_key: str = "prompt",
        chosen_key: str = "chosen",
        rejected_key: str = "rejected",
        max_length: int = 512,
        truncation: str = "error",
    ) -> None:
        pad = check_chat_dataset_args(
            tokenizer, truncation, PAIR_TRUNCATION_MODES, max_length, "preference pairs", "pairs"
        )
        self.files = as_file_list(files, "PairDataset")
        self.tokenizer = tokenizer
        self.prompt_key, self.chosen_key, self.rejected_key = prompt_key, chosen_key, rejected_key
        self.max_length = max_length
        self.truncation = truncation
        self.pad_token_id = int(pad)
        self.num_truncated = 0
        self._pairs: list[tuple[list[int], list[int]]] = []
        for file in self.files:
            for i, row in enumerate(read_rows(file)):
                self._pairs.append(self._pair(row, file, i))
        if not self._pairs:
            raise DataFileError(f"no rows in {', '.join(self.files)}")

    def _side(self, row: dict[str, Any], file: str, index: int, key: str) -> tuple[Messages, str]:
        """``(messages before the reply, reply)`` of the chosen or rejected column."""
        fail = partial(DataRowError, file, index, key)
        value = row[key]
        if isinstance(value, str):
            return [], value
        if not isinstance(value, (list, tuple)):
            raise fail(
                f"expected the assistant reply as a string (or a list of messages ending with it), "
                f"got {type(value).__name__}"
            )
        messages = check_messages(value, fail)
        if messages[-1]["role"] != ASSISTANT:
            raise fail(f"the last message must be the assistant reply, got role {messages[-1]['role']!r}")
        return messages[:-1], messages[-1]["content"]

    def _prompt(self, row: dict[str, Any], file: str, index: int) -> Messages:
        fail = partial(DataRowError, file, index, self.prompt_key)
        prompt = row[self.prompt_key]
        if isinstance(prompt, str):
            if not prompt.strip():
                raise fail("empty prompt")
            return [{"role": "user", "content": prompt}]
        return check_messages(prompt, fail)

    def _conversations(self, row: dict[str, Any], file: str, index: int) -> tuple[Messages, str, Messages, str]:
        """``(chosen context, chosen reply, rejected context, rejected reply)`` of one row."""
        for key in (self.chosen_key, self.rejected_key):
            if key not in row:
                raise DataRowError(file, index, key, f"missing column (row has: {', '.join(sorted(row)) or 'nothing'})")
        chosen_before, chosen = self._side(row, file, index, self.chosen_key)
        rejected_before, rejected = self._side(row, file, index, self.rejected_key)
        if self.prompt_key in row:
            prompt = self._prompt(row, file, index)
            return prompt + chosen_before, chosen, prompt + rejected_before, rejected
        if not chosen_before or chosen_before != rejected_before:
            problem = (
                "missing column"
                if not chosen_before
                else f"missing column, and the messages before the replies in {self.chosen_key!r} and "
                f"{self.rejected_key!r} differ, so they cannot stand for it"
            )
            raise DataRowError(file, index, self.prompt_key, f"{problem} (row has: {', '.join(sorted(row))})")
        return chosen_before, chosen, rejected_before, rejected

    def _fit(self, ids: list[int], file: str, index: int, key: str) -> list[int]:
        if len(ids) <= self.max_length:
            return ids
        if self.truncation == "error":
            raise DataRowError(
                file,
                index,
                key,
                f"prompt + reply is {len(ids)} tokens after the chat template, more than data.max_length="
                f"{self.max_length}; raise data.max_length or set data.truncation=left",
            )
        self.num_truncated += 1
        return ids[-self.max_length :]

    def _pair(self, row: dict[str, Any], file: str, index: int) -> tuple[list[int], list[int]]:
        chosen_messages, chosen, rejected_messages, rejected = self._conversations(row, file, index)
        chosen_ids = render_for_reward(self.tokenizer, chosen_messages, chosen)
        rejected_ids = render_for_reward(self.tokenizer, rejected_messages, rejected)
        return (
            self._fit(chosen_ids, file, index, self.chosen_key),
            self._fit(rejected_ids, file, index, self.rejected_key),
        )

    def __len__(self) -> int:
        return len(self._pairs)

    def __getitem__(self, item: int) -> dict[str, torch.Tensor]:
        chosen, rejected = self._pairs[item]
        chosen_ids, chosen_mask = _pad(chosen, self.max_length, self.pad_token_id)
        rejected_ids, rejected_mask = _pad(rejected, self.max_length, self.pad_token_id)
        return {
            CHOSEN_INPUT_IDS: chosen_ids,
            CHOSEN_ATTENTION_MASK: chosen_mask,
            REJECTED_INPUT_IDS: rejected_ids,
            REJECTED_ATTENTION_MASK: rejected_mask,
            F.ATTENTION_MASK: torch.maximum(chosen_mask, rejected_mask),
        }

    def token_ids(self, item: int) -> tuple[list[int], list[int]]:
        """The unpadded ``(chosen ids, rejected ids)`` of pair ``item``."""
        chosen, rejected = self._pairs[item]
        return list(chosen), list(rejected)
