"""``image_url`` content parts of chat messages: the vision-language prompt of a chat request.

OpenAI's chat API sends an image as ``{"type": "image_url", "image_url": {"url": ...}}``. The
server takes inline images only — ``data:image/<format>;base64,<payload>`` — and refuses a
remote ``http(s)`` URL with a 400 saying why: it makes no network requests (fetching a URL a
client names would let any client make the server call any host it can reach). The messages
go through the model folder's processor as the RL dataset's rows do
(:func:`~hybridflow.data.multimodal.encode_multimodal_prompt`: one vision block per image, its
pad token expanded into the image's tokens), and the prompt's 3-D rotary positions come from
:func:`~hybridflow.data.multimodal.rope_index`; the batcher prefills the request with both.
Images are checked as dataset images are (unreadable, or far above the processor's
``max_pixels``: a 400 naming the part).
"""

from __future__ import annotations

import base64
import binascii
import threading
from typing import Any

import torch

from hybridflow.data.multimodal import (
    decode_images,
    encode_multimodal_prompt,
    processor_max_pixels,
    rope_index,
    rope_settings,
)
from hybridflow.server.checks import BadRequest
from hybridflow.server.schemas import ChatCompletionRequest, ChatMessage

IMAGE_URL = "image_url"
# A processor's tokenizer is a fast tokenizer with mutable Rust state (see server/text.py):
# requests encode their images on worker threads, one at a time.
_PROCESSOR_LOCK = threading.Lock()


def has_image_parts(messages: list[ChatMessage]) -> bool:
    """Whether any message holds an ``image_url`` content part."""
    return any(
        isinstance(m.content, list) and any(part.get("type") == IMAGE_URL for part in m.content) for m in messages
    )


def image_bytes(part: dict[str, Any], where: str) -> bytes:
    """The encoded image of one ``image_url`` part; a remote or malformed URL is a 400."""
    value = part.get(IMAGE_URL)
    url = value.get("url") if isinstance(value, dict) else value
    if not isinstance(url, str):
        raise BadRequest(f"{where}: expected image_url {{'url': 'data:image/...;base64,...'}}", "messages")
    if url.startswith(("http://", "https://")):
        raise BadRequest(
            f"{where}: remote image URLs are not fetched (this server makes no network requests); send the "
            "image inline as a data:image/png;base64,... URL",
            "messages",
        )
    header, comma, payload = url.partition(",")
    if not (header.startswith("data:image/") and header.endswith(";base64") and comma):
        raise BadRequest(f"{where}: only data:image/<format>;base64,<payload> URLs are accepted", "messages")
    try:
        return base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError) as err:
        raise BadRequest(f"{where}: the image's base64 payload does not decode: {err}", "messages") from err


def processor_messages(messages: list[ChatMessage]) -> tuple[list[dict[str, Any]], list[bytes]]:
    """The messages with content parts as a multimodal chat template takes them (``text`` and
    ``image`` parts, in order), and each image's bytes in the order of its part."""
    out: list[dict[str, Any]] = []
    blobs: list[bytes] = []
    for i, message in enumerate(messages):
        data = message.model_dump(exclude_none=True)
        if isinstance(message.content, list):
            parts: list[dict[str, Any]] = []
            for j, part in enumerate(message.content):
                where = f"messages[{i}].content[{j}]"
                if part.get("type") == "text" and isinstance(part.get("text"), str):
                    parts.append({"type": "text", "text": part["text"]})
                elif part.get("type") == IMAGE_URL:
                    blobs.append(image_bytes(part, where))
                    parts.append({"type": "image"})
                else:
                    raise BadRequest(f"{where}: only 'text' and 'image_url' content parts are supported", "messages")
            data["content"] = parts
        out.append(data)
    return out, blobs


def image_prompt(
    processor: Any, model_name: str, body: ChatCompletionRequest
) -> tuple[list[int], dict[str, torch.Tensor], torch.Tensor]:
    """``(prompt ids, image inputs, positions (3, P))`` of a chat request with images, through
    ``processor`` (None: the model is text-only, a 400)."""
    if processor is None:
        raise BadRequest(
            f"model {model_name!r} does not take images: it is a text-only model, which takes only "
            "{'type': 'text', 'text': ...} content parts (image_url parts need a vision-language model such as "
            "Qwen2-VL, served with its processor)",
            "messages",
        )
    if body.tools:
        raise BadRequest("tools together with image_url content parts are not served yet", "tools")
    messages, blobs = processor_messages(body.messages)

    def fail(problem: str) -> BadRequest:
        return BadRequest(f"image_url: {problem}", "messages")

    images = decode_images(blobs, fail, max_pixels=processor_max_pixels(processor))
    with _PROCESSOR_LOCK:
        try:
            prompt = encode_multimodal_prompt(processor, messages, images, body.chat_template_kwargs)
        except (ValueError, TypeError, KeyError) as err:  # e.g. a template that cannot render the parts
            raise BadRequest(f"could not render the messages with their images: {err}", "messages") from err
    ids = torch.tensor(prompt.input_ids, dtype=torch.long)
    token_id, merge_size = rope_settings(processor)
    positions = rope_index(
        ids,
        torch.ones_like(ids),
        prompt.multi_modal_inputs.get("image_grid_thw"),
        image_token_id=token_id,
        spatial_merge_size=merge_size,
    )
    return prompt.input_ids, dict(prompt.multi_modal_inputs), positions
