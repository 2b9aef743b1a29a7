"""Multimodal RL prompts in verl's row layout: chat messages with ``<image>`` placeholders and the
images that fill them.

A multimodal row holds, besides the usual columns (``schema.py``), an images column
(``data.image_key``, default ``images``): a list with one image per ``<image>`` placeholder of
the prompt's messages, in order. Each image is stored the way verl reads them:

* a dict ``{"bytes": ..., "path": ...}`` — how Hugging Face ``datasets`` writes an ``Image``
  feature to parquet: the bytes when not null, else the path;
* raw bytes of an encoded image (PNG, JPEG, ...);
* a path string: absolute, or relative to the data file's folder (``file://`` accepted; remote
  URLs are not fetched);
* a PIL image (rows built in Python).

The prompt is rendered as verl renders it: each message whose text holds placeholders becomes
a list of content parts (``{"type": "text"}`` / ``{"type": "image"}``), the processor's chat
template writes one vision block per image, and the processor (the model folder's, see
:mod:`hybridflow.models.processor`) expands each block's pad token into as many tokens as the image has, returning the
image tensors (``multi_modal_inputs``: ``pixel_values``, ``image_grid_thw``). The decoded images
travel too (``multi_modal_data``: ``{"image": [PIL images]}``), for rollout engines that take
images rather than pixel values.

Rules that make a bad row an error naming the file, the row and the column: an image that is
missing, unreadable or not an image; a placeholder count that differs from the image count; an
image of more than :data:`OVERSIZE_FACTOR` times the processor's ``max_pixels`` (the processor
would shrink it that much anyway, so it is almost surely a wrong file, and decoding it costs
memory); any video (``<video>`` placeholders or a non-empty videos column): not supported yet.

Qwen2-VL places tokens with 3-D rotary positions (time, height, width); :func:`rope_index`
computes them from the token ids and the images' grids, as the model does, without the model.
"""

from __future__ import annotations

import io
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from PIL import Image

IMAGE_PLACEHOLDER = "<image>"
VIDEO_PLACEHOLDER = "<video>"
MULTI_MODAL_DATA = "multi_modal_data"
MULTI_MODAL_INPUTS = "multi_modal_inputs"
# An image more than this many times the processor's max_pixels is refused (see the module docstring).
OVERSIZE_FACTOR = 16
_PLACEHOLDER_SPLIT = re.compile(f"({re.escape(IMAGE_PLACEHOLDER)}|{re.escape(VIDEO_PLACEHOLDER)})")
# The processor's per-token outputs: the ids are kept apart, and positions are computed here.
_SEQUENCE_KEYS: tuple[str, ...] = ("input_ids", "attention_mask", "mm_token_type_ids")

Fail = Callable[[str], Exception]


@dataclass(frozen=True)
class MultimodalPrompt:
    """One rendered multimodal prompt: its token ids (image tokens expanded), the processor's
    image tensors (``pixel_values`` ``(patches, C·T·P·P)``, ``image_grid_thw`` ``(images, 3)``; empty
    without images) and the decoded images (``{"image": [...]}``)."""

    input_ids: list[int]
    multi_modal_inputs: dict[str, torch.Tensor]
    multi_modal_data: dict[str, list[Image.Image]]


def processor_max_pixels(processor: Any) -> int | None:
    """The most pixels the processor's image processor resizes an image to (None if unknown)."""
    image_processor = getattr(processor, "image_processor", None)
    value = getattr(image_processor, "max_pixels", None)
    size = getattr(image_processor, "size", None)
    if value is None and size is not None:
        value = size.get("longest_edge") if isinstance(size, Mapping) else getattr(size, "longest_edge", None)
    return int(value) if value else None


def count_placeholders(messages: Sequence[Mapping[str, Any]]) -> tuple[int, int]:
    """``(images, videos)``: how many ``<image>`` / ``<video>`` placeholders the messages' texts hold."""
    images = videos = 0
    for message in messages:
        content = message.get("content")
        if isinstance(content, str):
            images += content.count(IMAGE_PLACEHOLDER)
            videos += content.count(VIDEO_PLACEHOLDER)
    return images, videos


def to_processor_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The messages with each placeholder-holding text split into content parts, as a
    multimodal chat template expects; messages without placeholders are copied unchanged."""
    converted = []
    for message in messages:
        content = message.get("content")
        if not isinstance(content, str) or not _PLACEHOLDER_SPLIT.search(content):
            converted.append(dict(message))
            continue
        parts: list[dict[str, Any]] = []
        for segment in _PLACEHOLDER_SPLIT.split(content):
            if segment == IMAGE_PLACEHOLDER:
                parts.append({"type": "image"})
            elif segment == VIDEO_PLACEHOLDER:
                parts.append({"type": "video"})
            elif segment:
                parts.append({"type": "text", "text": segment})
        converted.append({**message, "content": parts})
    return converted


def decode_images(
    value: Any, fail: Fail, *, base_dir: Path | None = None, max_pixels: int | None = None
) -> list[Image.Image]:
    """A row's images column as RGB PIL images; ``fail(problem)`` builds the error for a bad one.

    ``None`` is no images. Each image's size is checked against ``OVERSIZE_FACTOR · max_pixels``
    from its header, before its pixels are decoded.
    """
    if value is None:
        return []
    if not isinstance(value, (list, tuple)):
        raise fail(f"expected a list of images (one per {IMAGE_PLACEHOLDER} placeholder), got {type(value).__name__}")
    return [_decode_one(item, k, fail, base_dir, max_pixels) for k, item in enumerate(value)]


def _decode_one(item: Any, k: int, fail: Fail, base_dir: Path | None, max_pixels: int | None) -> Image.Image:
    try:
        image = _open_image(item, base_dir)
    except (OSError, ValueError, EOFError, Image.DecompressionBombError) as exc:
        raise fail(f"image {k}: cannot be read as an image: {exc}") from exc
    width, height = image.size
    if max_pixels is not None and width * height > OVERSIZE_FACTOR * max_pixels:
        raise fail(
            f"image {k}: {width}x{height} = {width * height} pixels, more than {OVERSIZE_FACTOR}× the processor's "
            f"max_pixels ({max_pixels}); it would be shrunk {width * height / max_pixels:.0f}× anyway: resize the "
            "images of the data set (or check that this is the intended file)"
        )
    try:
        return image.convert("RGB")  # decodes the pixels: a truncated file fails here
    except (OSError, ValueError, EOFError) as exc:
        raise fail(f"image {k}: cannot be decoded: {exc}") from exc


def _open_image(item: Any, base_dir: Path | None) -> Image.Image:
    """The (lazily decoded) image an images-column entry stands for; raises ValueError / OSError."""
    if isinstance(item, Image.Image):
        return item
    if isinstance(item, Mapping):
        data, path = item.get("bytes"), item.get("path")
        if data is None and not path:
            raise ValueError(f"a dict with neither 'bytes' nor 'path' (keys: {', '.join(map(str, item)) or 'none'})")
        item = data if data is not None else path
    if isinstance(item, (bytes, bytearray, memoryview)):
        return Image.open(io.BytesIO(bytes(item)))
    if isinstance(item, str):
        return Image.open(_local_path(item, base_dir))
    raise ValueError(f"expected a {{bytes, path}} dict, bytes, a path or a PIL image, got {type(item).__name__}")


def _local_path(text: str, base_dir: Path | None) -> Path:
    if text.startswith(("http://", "https://")):
        raise ValueError(f"{text!r} is a remote URL; images are not downloaded: store their bytes or a local path")
    path = Path(text.removeprefix("file://")).expanduser()
    if not path.is_absolute() and base_dir is not None:
        path = base_dir / path
    if not path.is_file():
        raise ValueError(f"image file {str(path)!r} not found")
    return path


def check_media_counts(
    messages: Sequence[Mapping[str, Any]], num_images: int, videos: Any, fail_images: Fail, fail_videos: Fail
) -> None:
    """Placeholders against images (one each, in order), and no videos (not supported yet)."""
    image_slots, video_slots = count_placeholders(messages)
    if video_slots or (videos is not None and len(videos) > 0):
        raise fail_videos(
            f"videos are not supported yet ({video_slots} {VIDEO_PLACEHOLDER} placeholders, "
            f"{0 if videos is None else len(videos)} videos)"
        )
    if image_slots != num_images:
        raise fail_images(
            f"the prompt has {image_slots} {IMAGE_PLACEHOLDER} placeholders but the row has {num_images} images; "
            "each image needs exactly one placeholder, in order"
        )


def decode_checked_images(
    processor: Any,
    messages: Sequence[Mapping[str, Any]],
    images: Any,
    videos: Any,
    fail_images: Fail,
    fail_videos: Fail,
    base_dir: Path | None = None,
) -> list[Image.Image]:
    """A row's images decoded (bounded by the processor's ``max_pixels``), then checked against
    its placeholders: the order every dataset follows, so a broken image is reported as such
    rather than as a count mismatch."""
    decoded = decode_images(images, fail_images, base_dir=base_dir, max_pixels=processor_max_pixels(processor))
    check_media_counts(messages, len(decoded), videos, fail_images, fail_videos)
    return decoded


def render_prompt(
    processor: Any, messages: Sequence[Mapping[str, Any]], chat_template_kwargs: Mapping[str, Any] | None = None
) -> str:
    """The prompt text through the processor's chat template (the tokenizer's if the processor
    has none), opened for the assistant's reply; one vision block per image placeholder."""
    parts = to_processor_messages(messages)
    kwargs = dict(chat_template_kwargs or {})
    renderer = processor if getattr(processor, "chat_template", None) else processor.tokenizer
    return renderer.apply_chat_template(parts, add_generation_prompt=True, tokenize=False, **kwargs)


def encode_multimodal_prompt(
    processor: Any,
    messages: Sequence[Mapping[str, Any]],
    images: Sequence[Image.Image],
    chat_template_kwargs: Mapping[str, Any] | None = None,
) -> MultimodalPrompt:
    """Render and process one prompt: token ids with the image tokens expanded, the image
    tensors, and the images. ``images`` must match the placeholders (see :func:`check_media_counts`)."""
    text = render_prompt(processor, messages, chat_template_kwargs)
    features = processor(text=[text], images=list(images) or None, return_tensors="pt")
    input_ids = [int(i) for i in features["input_ids"][0].tolist()]
    inputs = {key: value for key, value in features.items() if key not in _SEQUENCE_KEYS}
    return MultimodalPrompt(input_ids, inputs, {"image": list(images)})


def rope_settings(processor: Any) -> tuple[int, int]:
    """``(image_token_id, spatial_merge_size)`` of a Qwen2-VL-style processor: what :func:`rope_index` needs."""
    token_id = getattr(processor, "image_token_id", None)
    if token_id is None:
        token_id = processor.tokenizer.convert_tokens_to_ids(processor.image_token)
    return int(token_id), int(processor.image_processor.merge_size)


def rope_index(
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    image_grid_thw: torch.Tensor | None,
    *,
    image_token_id: int,
    spatial_merge_size: int,
) -> torch.Tensor:
    """Qwen2-VL's 3-D rotary positions ``(3, L)`` (time, height, width) of one padded row.

    Text tokens count up on all three axes alike. An image's ``t·(h/m)·(w/m)`` tokens (``m``
    the spatial merge size) take the position where the image starts plus their time / row /
    column index, and the text after it resumes ``max(h, w)/m`` past that start: the numbers
    ``get_rope_index`` of transformers' Qwen2-VL model gives, with padding at position 0.
    """
    tokens = input_ids[attention_mask.bool()].tolist()
    grids = [] if image_grid_thw is None else [tuple(int(x) for x in g) for g in image_grid_thw.tolist()]
    pieces: list[torch.Tensor] = []
    pos = i = used = 0
    while i < len(tokens):
        if tokens[i] != image_token_id:
            end = i
            while end < len(tokens) and tokens[end] != image_token_id:
                end += 1
            pieces.append(torch.arange(pos, pos + end - i).expand(3, -1))
            pos, i = pos + end - i, end
            continue
        if used >= len(grids):
            raise ValueError(f"more image token runs than the {len(grids)} image grids")
        t, h, w = grids[used][0], grids[used][1] // spatial_merge_size, grids[used][2] // spatial_merge_size
        if tokens[i : i + t * h * w] != [image_token_id] * (t * h * w):
            raise ValueError(f"image {used}: grid {grids[used]} needs {t * h * w} image tokens in a row")
        grid = torch.stack(torch.meshgrid(torch.arange(t), torch.arange(h), torch.arange(w), indexing="ij"))
        pieces.append(grid.reshape(3, -1) + pos)
        pos, i, used = pos + max(h, w), i + t * h * w, used + 1
    if used != len(grids):
        raise ValueError(f"{len(grids)} image grids but {used} image token runs")
    positions = torch.zeros(3, input_ids.shape[0], dtype=torch.long)
    if pieces:
        positions[:, attention_mask.bool()] = torch.cat(pieces, dim=1)
    return positions


def processor_rope_index(
    processor: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor, image_grid_thw: torch.Tensor | None
) -> torch.Tensor:
    """:func:`rope_index` of one padded row with the processor's image token and merge size."""
    token_id, merge_size = rope_settings(processor)
    return rope_index(input_ids, attention_mask, image_grid_thw, image_token_id=token_id, spatial_merge_size=merge_size)
