"""The RL prompt dataset: verl-schema rows → chat-templated (or plain-text), left-padded prompt tensors.

Every row is validated and tokenized once at construction, so a malformed row or an
over-long prompt is reported before training starts, not at step 500.
"""

from __future__ import annotations

import os
import random
from collections.abc import Sequence
from typing import Any

import torch
from torch.utils.data import Dataset

from hybridflow import fields as F
from hybridflow.data.dataset_args import as_file_list, check_truncation, tokenizer_pad_id
from hybridflow.data.io import DataFileError, read_rows
from hybridflow.data.prompt_text import prompt_token_ids
from hybridflow.data.schema import ABILITY, AGENT_NAME, PROMPT_KEY, DataRowError, RLRow, validate_rl_row

TRUNCATION_MODES: tuple[str, ...] = ("error", "left", "right", "middle")
RAW_PROMPT_IDS = "raw_prompt_ids"
INDEX = "index"


def truncate_ids(ids: list[int], max_length: int, mode: str) -> list[int]:
    """Cut ``ids`` to at most ``max_length`` tokens.

    ``left`` keeps the last ``max_length`` tokens, ``right`` the first, ``middle`` the first
    ``max_length // 2`` and the last ``max_length - max_length // 2``; ``error`` raises.
    """
    if mode not in TRUNCATION_MODES:
        raise ValueError(f"unknown truncation mode {mode!r}; valid: {', '.join(TRUNCATION_MODES)}")
    if len(ids) <= max_length:
        return list(ids)
    if mode == "left":
        return list(ids[-max_length:])
    if mode == "right":
        return list(ids[:max_length])
    if mode == "middle":
        head = max_length // 2
        tail = max_length - head
        return list(ids[:head]) + (list(ids[-tail:]) if tail else [])
    raise ValueError(f"prompt has {len(ids)} tokens, more than max_length={max_length} (truncation='error')")


def left_pad(ids: list[int], length: int, pad_token_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Left-pad to ``length``: returns ``input_ids``, ``attention_mask``, ``position_ids``, each ``(length,)``.

    Position ids count real tokens only: ``clamp(cumsum(mask) - 1, min=0)``, so the first
    real token is position 0 whatever the padding.
    """
    if len(ids) > length:
        raise ValueError(f"{len(ids)} ids do not fit in length {length}")
    pad = length - len(ids)
    input_ids = torch.tensor([pad_token_id] * pad + list(ids), dtype=torch.long)
    attention_mask = torch.tensor([0] * pad + [1] * len(ids), dtype=torch.long)
    position_ids = torch.clamp(torch.cumsum(attention_mask, dim=0) - 1, min=0)
    return input_ids, attention_mask, position_ids


class RLDataset(Dataset):
    """Prompts for RL from parquet / JSON-lines files in verl's schema (see ``schema.py``).

    Args:
        files: one path or a list (``~`` is expanded); rows are concatenated in order.
        tokenizer: a Hugging Face tokenizer (with a chat template unless ``apply_chat_template``
            is false).
        prompt_key: column holding the chat messages (or, with ``apply_chat_template`` false,
            also a plain string: one user message).
        max_prompt_length: prompts are left-padded to exactly this many tokens.
        truncation: what to do with a longer prompt: ``error`` (raise at construction),
            ``left`` / ``right`` / ``middle`` (see :func:`truncate_ids`).
        filter_overlong_prompts: drop longer prompts at construction instead (wins over truncation).
        return_raw_chat: also return the messages under ``raw_prompt`` (for chat-based rollouts).
        max_samples: keep at most this many rows (``None``/``-1``: all): the first ones, or a
            random subset (in file order) when ``seed`` is given.
        seed: seed for the ``max_samples`` subset.
        chat_template_kwargs: extra keyword arguments for ``apply_chat_template``.
        apply_chat_template: render prompts through the chat template (true), or as plain text
            (false; for base models): see :mod:`hybridflow.data.prompt_text`.

    ``ds[i]`` is a dict: ``input_ids`` / ``attention_mask`` / ``position_ids`` — long tensors
    ``(max_prompt_length,)`` — and non-tensors ``raw_prompt_ids`` (unpadded ids), ``data_source``,
    ``reward_model``, ``extra_info``, ``ability``, ``index`` and ``raw_prompt`` if requested.
    """

    def __init__(
        self,
        files: str | os.PathLike | Sequence[str | os.PathLike],
        tokenizer: Any,
        *,
        prompt_key: str = PROMPT_KEY,
        max_prompt_length: int = 512,
        truncation: str = "error",
        filter_overlong_prompts: bool = False,
        return_raw_chat: bool = False,
        max_samples: int | None = None,
        seed: int | None = None,
        chat_template_kwargs: dict[str, Any] | None = None,
        apply_chat_template: bool = True,
    ) -> None:
        check_truncation(truncation, TRUNCATION_MODES)
        if not isinstance(max_prompt_length, int) or max_prompt_length < 1:
            raise ValueError(f"max_prompt_length must be a positive integer, got {max_prompt_length!r}")
        self.files = as_file_list(files, "RLDataset")
        self.tokenizer = tokenizer
        self.prompt_key = prompt_key
        self.max_prompt_length = max_prompt_length
        self.truncation = truncation
        self.return_raw_chat = return_raw_chat
        self.pad_token_id = tokenizer_pad_id(tokenizer, "prompts")
        self._chat_template_kwargs = dict(chat_template_kwargs or {})
        self.apply_chat_template = apply_chat_template

        entries = self._load_rows()
        token_ids = self._tokenize([row.messages for _, _, row in entries])
        kept = self._apply_length_policy(entries, token_ids, filter_overlong_prompts)
        self.num_filtered = len(entries) - len(kept)  # over-long prompts dropped
        kept = _subset(kept, max_samples, seed)
        self._rows: list[RLRow] = [entries[k][2] for k in kept]
        self._ids: list[list[int]] = [token_ids[k] for k in kept]
        # verl's agent_name column: present on every row (None = the default loop) when any row names one
        self.has_agent_names = any(row.agent_name is not None for row in self._rows)

    def _load_rows(self) -> list[tuple[str, int, RLRow]]:
        entries = []
        for file in self.files:
            for i, raw in enumerate(read_rows(file)):
                if not self.apply_chat_template and isinstance(raw.get(self.prompt_key), str):
                    raw = {**raw, self.prompt_key: [{"role": "user", "content": raw[self.prompt_key]}]}
                entries.append((file, i, validate_rl_row(raw, file=file, row_index=i, prompt_key=self.prompt_key)))
        if not entries:
            raise DataFileError(f"no rows in {', '.join(self.files)}")
        return entries

    def _tokenize(self, conversations: list[list[dict[str, Any]]]) -> list[list[int]]:
        return prompt_token_ids(self.tokenizer, conversations, self.apply_chat_template, self._chat_template_kwargs)

    def _apply_length_policy(
        self, entries: list[tuple[str, int, RLRow]], token_ids: list[list[int]], filter_overlong: bool
    ) -> list[int]:
        """Indices of the rows to keep; raises on the first over-long row under ``truncation='error'``."""
        kept = []
        for k, ((file, i, _), ids) in enumerate(zip(entries, token_ids, strict=True)):
            if len(ids) <= self.max_prompt_length:
                kept.append(k)
            elif filter_overlong:
                continue
            elif self.truncation == "error":
                raise DataRowError(
                    file,
                    i,
                    self.prompt_key,
                    f"prompt is {len(ids)} tokens after {'the chat template' if self.apply_chat_template else 'tokenization'}, more than max_prompt_length="
                    f"{self.max_prompt_length}; raise max_prompt_length, set truncation to left/right/middle, "
                    "or set filter_overlong_prompts=True",
                )
            else:
                kept.append(k)
        if not kept:
            raise ValueError(
                f"every prompt in {', '.join(self.files)} is longer than max_prompt_length={self.max_prompt_length}"
            )
        return kept

    def __len__(self) -> int:
        return len(self._rows)

    def __getitem__(self, item: int) -> dict[str, Any]:
        row = self._rows[item]
        ids = truncate_ids(self._ids[item], self.max_prompt_length, self.truncation)
        input_ids, attention_mask, position_ids = left_pad(ids, self.max_prompt_length, self.pad_token_id)
        out: dict[str, Any] = {
            F.INPUT_IDS: input_ids,
            F.ATTENTION_MASK: attention_mask,
            F.POSITION_IDS: position_ids,
            RAW_PROMPT_IDS: ids,
            F.DATA_SOURCE: row.data_source,
            F.REWARD_MODEL: row.reward_model,
            F.EXTRA_INFO: row.extra_info,
            ABILITY: row.ability,
            INDEX: row.index,
        }
        if self.return_raw_chat or self.has_agent_names:  # agent loops render the messages
            out[F.RAW_PROMPT] = row.messages
        if self.has_agent_names:
            out[AGENT_NAME] = row.agent_name
        return out


def _subset(kept: list[int], max_samples: int | None, seed: int | None) -> list[int]:
    if max_samples is None or max_samples < 0 or max_samples >= len(kept):
        return kept
    if max_samples == 0:
        raise ValueError("max_samples=0 would leave an empty dataset; use None or -1 for all rows")
    if seed is None:
        return kept[:max_samples]
    chosen = sorted(random.Random(seed).sample(range(len(kept)), max_samples))
    return [kept[j] for j in chosen]
