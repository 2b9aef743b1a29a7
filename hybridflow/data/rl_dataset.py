"""The RL prompt dataset: verl-schema rows → chat-templated (or plain-text), left-padded prompt tensors.

Every row is validated and tokenized once at construction, so a malformed row or an
over-long prompt is reported before training starts, not at step 500. Rows with images (verl's
multimodal layout, :mod:`hybridflow.data.multimodal`) go through the model's processor.
"""

from __future__ import annotations

import os
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import Dataset

from hybridflow import fields as F
from hybridflow.data.dataset_args import as_file_list, check_truncation, tokenizer_pad_id
from hybridflow.data.io import DataFileError, read_rows
from hybridflow.data.multimodal import (
    MULTI_MODAL_DATA,
    MULTI_MODAL_INPUTS,
    Fail,
    MultimodalPrompt,
    check_media_counts,
    decode_checked_images,
    encode_multimodal_prompt,
    processor_rope_index,
)
from hybridflow.data.prompt_text import prompt_token_ids
from hybridflow.data.schema import ABILITY, AGENT_NAME, PROMPT_KEY, DataRowError, RLRow, validate_rl_row

TRUNCATION_MODES: tuple[str, ...] = ("error", "left", "right", "middle")
RAW_PROMPT_IDS = "raw_prompt_ids"
INDEX = "index"
IMAGE_KEY = "images"
VIDEO_KEY = "videos"


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
        processor: the model folder's multimodal processor (``hybridflow.models.processor.load_processor``);
            needed when rows have images.
        image_key / video_key: the columns holding a row's images / videos (``None``: no such column).

    ``ds[i]`` is a dict: ``input_ids`` / ``attention_mask`` / ``position_ids`` — long tensors
    ``(max_prompt_length,)`` — and non-tensors ``raw_prompt_ids`` (unpadded ids), ``data_source``,
    ``reward_model``, ``extra_info``, ``ability``, ``index`` and ``raw_prompt`` if requested.

    When any row has images the dataset is multimodal: every prompt is rendered by the processor
    (its image tokens expanded, and counted against ``max_prompt_length``), ``position_ids`` are
    Qwen2-VL's 3-D rotary positions ``(3, max_prompt_length)``, and each item also carries
    ``multi_modal_data`` (``{"image": [PIL images]}``) and ``multi_modal_inputs`` (the
    processor's ``pixel_values`` / ``image_grid_thw``; empty for a row without images). Images
    are decoded again for each item rather than kept in memory. An over-long multimodal prompt
    is an error or filtered, never truncated (a cut would separate image tokens from pixels).
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
        processor: Any = None,
        image_key: str | None = IMAGE_KEY,
        video_key: str | None = VIDEO_KEY,
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
        self.processor = processor
        self.image_key, self.video_key = image_key, video_key

        entries, media = self._load_rows()
        # multimodal when any row has an image or a video; then every row goes through the processor
        self.multimodal = any(bool(images) or bool(videos) for images, videos in media)
        if self.multimodal:
            token_ids = self._encode_multimodal(entries, media)
        else:
            self._check_text_rows(entries, media)
            token_ids = self._tokenize([row.messages for _, _, row in entries])
        kept = self._apply_length_policy(entries, token_ids, filter_overlong_prompts)
        self.num_filtered = len(entries) - len(kept)  # over-long prompts dropped
        kept = _subset(kept, max_samples, seed)
        self._rows: list[RLRow] = [entries[k][2] for k in kept]
        self._ids: list[list[int]] = [token_ids[k] for k in kept]
        # where each kept row's images come from (file, row index, images column), decoded per item
        self._media: list[tuple[str, int, Any]] = [(entries[k][0], entries[k][1], media[k][0]) for k in kept]
        # verl's agent_name column: present on every row (None = the default loop) when any row names one
        self.has_agent_names = any(row.agent_name is not None for row in self._rows)

    def _load_rows(self) -> tuple[list[tuple[str, int, RLRow]], list[tuple[Any, Any]]]:
        """The validated rows, and each row's (images, videos) columns (None where absent)."""
        entries, media = [], []
        for file in self.files:
            for i, raw in enumerate(read_rows(file)):
                if not self.apply_chat_template and isinstance(raw.get(self.prompt_key), str):
                    raw = {**raw, self.prompt_key: [{"role": "user", "content": raw[self.prompt_key]}]}
                entries.append((file, i, validate_rl_row(raw, file=file, row_index=i, prompt_key=self.prompt_key)))
                media.append(
                    (
                        raw.get(self.image_key) if self.image_key else None,
                        raw.get(self.video_key) if self.video_key else None,
                    )
                )
        if not entries:
            raise DataFileError(f"no rows in {', '.join(self.files)}")
        return entries, media

    def _check_text_rows(self, entries: list[tuple[str, int, RLRow]], media: list[tuple[Any, Any]]) -> None:
        """In a dataset without images, a row that has an (empty) images column must have no placeholders."""
        for (file, i, row), (images, videos) in zip(entries, media, strict=True):
            if images is not None or videos is not None:
                check_media_counts(
                    row.messages,
                    0,
                    videos,
                    self._row_fail(file, i, self.image_key),
                    self._row_fail(file, i, self.video_key),
                )

    def _row_fail(self, file: str, row_index: int, field: str | None) -> Fail:
        return lambda problem: DataRowError(file, row_index, field or "", problem)

    def _encode_multimodal(
        self, entries: list[tuple[str, int, RLRow]], media: list[tuple[Any, Any]]
    ) -> list[list[int]]:
        """Each row's prompt ids through the processor (image tokens expanded); checks every image."""
        if self.processor is None:
            raise DataFileError(
                f"{', '.join(self.files)}: rows have images or videos (columns {self.image_key!r}, {self.video_key!r}) but no "
                "processor was given; they need a vision-language model whose folder has an image processor (preprocessor_config.json)"
            )
        if not self.apply_chat_template:
            raise DataFileError(
                f"{', '.join(self.files)}: rows with images need data.apply_chat_template=true "
                "(the chat template writes each image's vision block)"
            )
        return [
            self._encode_row(file, i, row, images, videos).input_ids
            for (file, i, row), (images, videos) in zip(entries, media, strict=True)
        ]

    def _encode_row(self, file: str, row_index: int, row: RLRow, images: Any, videos: Any = None) -> MultimodalPrompt:
        """Decode the row's images, check them against its placeholders, run the processor."""
        decoded = decode_checked_images(
            self.processor,
            row.messages,
            images,
            videos,
            self._row_fail(file, row_index, self.image_key),
            self._row_fail(file, row_index, self.video_key),
            base_dir=Path(file).parent,
        )
        return encode_multimodal_prompt(self.processor, row.messages, decoded, self._chat_template_kwargs)

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
            elif self.truncation == "error" or self.multimodal:
                raise DataRowError(
                    file,
                    i,
                    self.prompt_key,
                    f"prompt is {len(ids)} tokens after {self._rendering()}, more than max_prompt_length="
                    f"{self.max_prompt_length}; raise max_prompt_length, "
                    f"{'' if self.multimodal else 'set truncation to left/right/middle, '}"
                    "or set filter_overlong_prompts=True"
                    f"{' (prompts with images are never truncated)' if self.multimodal else ''}",
                )
            else:
                kept.append(k)
        if not kept:
            raise ValueError(
                f"every prompt in {', '.join(self.files)} is longer than max_prompt_length={self.max_prompt_length}"
            )
        return kept

    def _rendering(self) -> str:
        if self.multimodal:
            return "the processor (image tokens included)"
        return "the chat template" if self.apply_chat_template else "tokenization"

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
        if self.multimodal:
            self._add_multimodal(item, out)
        return out

    def _add_multimodal(self, item: int, out: dict[str, Any]) -> None:
        """The item's images (decoded again), the processor's tensors and the 3-D positions."""
        file, row_index, images = self._media[item]
        prompt = self._encode_row(file, row_index, self._rows[item], images)
        if prompt.input_ids != self._ids[item]:  # an image file changed since the dataset was built
            raise DataRowError(file, row_index, self.image_key or "", "its images changed since the dataset was loaded")
        out[F.POSITION_IDS] = processor_rope_index(
            self.processor, out[F.INPUT_IDS], out[F.ATTENTION_MASK], prompt.multi_modal_inputs.get("image_grid_thw")
        )
        out[MULTI_MODAL_DATA] = prompt.multi_modal_data
        out[MULTI_MODAL_INPUTS] = prompt.multi_modal_inputs


def _subset(kept: list[int], max_samples: int | None, seed: int | None) -> list[int]:
    if max_samples is None or max_samples < 0 or max_samples >= len(kept):
        return kept
    if max_samples == 0:
        raise ValueError("max_samples=0 would leave an empty dataset; use None or -1 for all rows")
    if seed is None:
        return kept[:max_samples]
    chosen = sorted(random.Random(seed).sample(range(len(kept)), max_samples))
    return [kept[j] for j in chosen]
