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

Rows with images (verl's multi-turn SFT layout: ``<image>`` placeholders in the messages' text,
an images column ``image_key`` with one image per placeholder, in order; the image forms of
:mod:`hybridflow.data.multimodal`) need the model's ``processor``. The conversation is then
rendered as an RL prompt with images is (content parts, the processor's chat template), cut into
turns as above, and each image's pad token is repeated as many times as the processor gives the
image tokens (:func:`tokenize_image_conversation`); image tokens are never targets, and an image
inside a trained assistant turn is an error. Every item of such a dataset also carries
``multi_modal_inputs`` (``pixel_values``, ``image_grid_thw``; ``{}`` for a row without images)
and Qwen2-VL's 3-D positions ``(3, max_length)``. A row with images is never truncated (a cut
would separate image tokens from their pixels).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import Dataset

from hybridflow import fields as F
from hybridflow.data.dataset_args import as_file_list, check_chat_dataset_args
from hybridflow.data.io import DataFileError, read_rows
from hybridflow.data.multimodal import (
    MULTI_MODAL_INPUTS,
    check_media_counts,
    decode_checked_images,
    decode_images,
    encode_multimodal_prompt,
    processor_max_pixels,
    processor_rope_index,
    rope_settings,
    to_processor_messages,
)
from hybridflow.data.schema import DataRowError, check_message_dicts
from hybridflow.data.sft_images import ImageRow, ProcessorChat, expand_image_tokens
from hybridflow.utils.errors import InputError

LOSS_MASK = "loss_mask"
ToolPrompt = Callable[[list[dict[str, Any]], list[dict[str, Any]]], list[dict[str, Any]]]
"""``(messages, tool schemas) → messages`` to render (e.g. with the tools described in the system message)."""
SFT_TRUNCATION_MODES: tuple[str, ...] = ("error", "left", "right")
ASSISTANT = "assistant"
IMAGE_KEY = "images"
VIDEO_KEY = "videos"


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


def tokenize_image_conversation(
    processor: Any,
    tokenizer: Any,
    messages: list[dict[str, Any]],
    images: Sequence[Any],
    first_trained: int = 0,
    chat_template_kwargs: dict[str, Any] | None = None,
    tools: list[dict[str, Any]] | None = None,
) -> tuple[list[int], list[int], dict[str, torch.Tensor]]:
    """``(input_ids, loss_mask, multi_modal_inputs)`` of a conversation whose texts hold
    ``<image>`` placeholders filled by ``images`` (PIL, in order): :func:`tokenize_conversation`
    over the content-part messages, then :func:`expand_image_tokens` with the processor's grids.
    ``multi_modal_inputs`` is ``{}`` without images."""
    kwargs = dict(chat_template_kwargs or {})
    chat = ProcessorChat(processor, tokenizer)
    ids, mask = tokenize_conversation(chat, to_processor_messages(messages), first_trained, kwargs, tools)
    inputs = encode_multimodal_prompt(processor, messages, images, kwargs).multi_modal_inputs if images else {}
    grid = inputs.get("image_grid_thw")
    token_id, merge_size = rope_settings(processor)
    ids, mask = expand_image_tokens(ids, mask, [] if grid is None else grid.tolist(), token_id, merge_size)
    return ids, mask, inputs


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
        processor: the model folder's multimodal processor
            (:func:`hybridflow.models.processor.load_processor`); needed when rows have images.
        image_key / video_key: the columns of a row's images / videos (``None``: no such column;
            videos are refused).

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
        processor: Any = None,
        image_key: str | None = IMAGE_KEY,
        video_key: str | None = VIDEO_KEY,
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
        self.processor, self.image_key, self.video_key = processor, image_key, video_key
        rows = [(file, i, row) for file in self.files for i, row in enumerate(read_rows(file))]
        # with images anywhere, every row is rendered as image rows are and carries 3-D positions
        self.multimodal = any(self._has_media(row) for _, _, row in rows)
        self._examples: list[tuple[list[int], list[int]]] = []
        self._media: list[ImageRow] = []  # one per row when multimodal, else empty
        for file, i, row in rows:
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
            if self.multimodal:
                ids, mask = self._tokenize_with_images(row, file, index, messages, first_trained, tools)
            else:
                self._check_text_row(row, file, index, messages)
                ids, mask = tokenize_conversation(self.tokenizer, messages, first_trained, self._kwargs, tools)
        except ChatTemplateError as err:
            raise DataRowError(file, index, field, str(err)) from None
        if len(ids) > self.max_length:
            has_images = bool(self.multimodal and self._media[-1].grids)
            if self.truncation == "error" or has_images:
                raise DataRowError(
                    file,
                    index,
                    field,
                    f"example is {len(ids)} tokens after the chat template, more than data.max_length="
                    f"{self.max_length}; raise data.max_length"
                    + (
                        " (rows with images are never truncated)"
                        if has_images
                        else " or set data.truncation to left/right"
                    ),
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

    def _has_media(self, row: dict[str, Any]) -> bool:
        return any(bool(row.get(key)) for key in (self.image_key, self.video_key) if key)

    def _fail(self, file: str, index: int, key: str | None) -> Callable[[str], Exception]:
        return partial(DataRowError, file, index, key or "")

    def _check_text_row(self, row: dict[str, Any], file: str, index: int, messages: list[dict[str, Any]]) -> None:
        """A row of a dataset without images: an (empty) images column means no placeholders."""
        images = row.get(self.image_key) if self.image_key else None
        videos = row.get(self.video_key) if self.video_key else None
        if images is not None or videos is not None:
            fail_images, fail_videos = self._fail(file, index, self.image_key), self._fail(file, index, self.video_key)
            check_media_counts(messages, 0, videos, fail_images, fail_videos)

    def _decode(self, file: str, index: int, images: Any) -> list[Any]:
        fail = self._fail(file, index, self.image_key)
        return decode_images(images, fail, base_dir=Path(file).parent, max_pixels=processor_max_pixels(self.processor))

    def _tokenize_with_images(
        self,
        row: dict[str, Any],
        file: str,
        index: int,
        messages: list[dict[str, Any]],
        first_trained: int,
        tools: list[dict[str, Any]] | None,
    ) -> tuple[list[int], list[int]]:
        """Tokenize a row of a dataset with images (checked against its placeholders); records
        where its images come from."""
        fail_images = self._fail(file, index, self.image_key)
        if self.processor is None:
            raise fail_images(
                "the row has images but no processor was given; SFT on images needs a vision-language model "
                "whose folder has an image processor (preprocessor_config.json)"
            )
        images = row.get(self.image_key) if self.image_key else None
        videos = row.get(self.video_key) if self.video_key else None
        decoded = decode_checked_images(
            self.processor,
            messages,
            images,
            videos,
            fail_images,
            self._fail(file, index, self.video_key),
            base_dir=Path(file).parent,
        )
        try:
            ids, mask, inputs = tokenize_image_conversation(
                self.processor, self.tokenizer, messages, decoded, first_trained, self._kwargs, tools
            )
        except ChatTemplateError:
            raise
        except ValueError as err:
            raise fail_images(str(err)) from None
        grid = inputs.get("image_grid_thw")
        self._media.append(ImageRow(file, index, images, messages, [] if grid is None else grid.tolist()))
        return ids, mask

    def __len__(self) -> int:
        return len(self._examples)

    def __getitem__(self, item: int) -> dict[str, Any]:
        ids, mask = self._examples[item]
        out: dict[str, Any] = right_pad(ids, mask, self.max_length, self.pad_token_id)
        if self.multimodal:
            self._add_images(item, out)
        return out

    def _add_images(self, item: int, out: dict[str, Any]) -> None:
        """The item's image tensors (its images decoded again; ``{}`` without) and 3-D positions."""
        media = self._media[item]
        decoded = self._decode(media.file, media.index, media.images)
        inputs = encode_multimodal_prompt(self.processor, media.messages, decoded, self._kwargs).multi_modal_inputs
        inputs = inputs if decoded else {}
        grid = inputs.get("image_grid_thw")
        if ([] if grid is None else grid.tolist()) != media.grids:
            raise self._fail(media.file, media.index, self.image_key)("its images changed since the dataset was loaded")
        out[F.POSITION_IDS] = processor_rope_index(self.processor, out[F.INPUT_IDS], out[F.ATTENTION_MASK], grid)
        out[MULTI_MODAL_INPUTS] = inputs

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
