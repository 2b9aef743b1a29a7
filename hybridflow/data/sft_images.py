"""Pieces of SFT on conversations with images (used by
:func:`~hybridflow.data.sft_dataset.tokenize_image_conversation`).

The conversation is rendered the way an RL prompt with images is (content parts, the
processor's chat template: :class:`ProcessorChat`) and cut into turns by the text rules, so the
chat template writes one image pad token per image; :func:`expand_image_tokens` then repeats
each as many times as the processor gives that image tokens. Image tokens are never targets.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


class ProcessorChat:
    """The tokenizer, with chat templates rendered by whatever renders RL prompts with images
    (:func:`~hybridflow.data.multimodal.render_prompt`: the processor's template, else the
    tokenizer's), so an image conversation is cut into turns as its RL prompt is rendered."""

    def __init__(self, processor: Any, tokenizer: Any) -> None:
        self._renderer = processor if getattr(processor, "chat_template", None) else tokenizer
        self._tokenizer = tokenizer
        self.eos_token_id = tokenizer.eos_token_id

    def apply_chat_template(self, messages: list[dict[str, Any]], **kwargs: Any) -> str:
        return self._renderer.apply_chat_template(messages, **kwargs)

    def __call__(self, text: str, **kwargs: Any) -> Any:
        return self._tokenizer(text, **kwargs)


def expand_image_tokens(
    ids: list[int], mask: list[int], grids: list[list[int]], image_token_id: int, merge_size: int
) -> tuple[list[int], list[int]]:
    """Each image pad token of ``ids`` (the chat template writes one per image) repeated
    ``t·h·w / merge_size²`` times for its image's grid ``(t, h, w)``, as the processor expands
    it; mask 0 on all of them. Raises ValueError when pads and grids differ in number, or a pad
    lies in a trained turn (an image is context, never a target)."""
    pads = [k for k, token in enumerate(ids) if token == image_token_id]
    if len(pads) != len(grids):
        raise ValueError(f"the chat template wrote {len(pads)} image pad tokens for {len(grids)} images")
    out_ids: list[int] = []
    out_mask: list[int] = []
    start = 0
    for k, (t, h, w) in zip(pads, grids, strict=True):
        if mask[k]:
            raise ValueError(
                "an image is inside a trained assistant turn; images can only be context (system, user or "
                "tool messages, or turns before the trained ones)"
            )
        count = int(t) * int(h) * int(w) // merge_size**2
        out_ids += ids[start:k] + [image_token_id] * count
        out_mask += mask[start:k] + [0] * count
        start = k + 1
    return out_ids + ids[start:], out_mask + mask[start:]


@dataclass(frozen=True)
class ImageRow:
    """Where a row of a dataset with images takes its images from, to decode them per item."""

    file: str
    index: int
    images: Any  # the row's images column (None: no images)
    messages: list[dict[str, Any]]
    grids: list[list[int]]  # image_grid_thw at construction
