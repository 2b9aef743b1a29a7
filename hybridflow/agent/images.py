"""A row's images for the agent loops: its prompt's image tokens, 3-D positions and pixels.

An image row (a non-empty ``multi_modal_inputs``, from the RL dataset's processor) is answered
on an engine that takes images (:class:`~hybridflow.inference.protocol.PromptImages`). The
loops render prompts with the tokenizer's chat template, which writes one image pad token per
image; :func:`expand_image_tokens` repeats each pad as many times as the processor gives that
image tokens (``t·h·w / merge²``), as the processor does, and :func:`prompt_images` places the
prompt on Qwen2-VL's three rotary axes (:func:`~hybridflow.data.multimodal.rope_index`). Later
turns of the same trajectory send the same object: tool results are text after the images.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from hybridflow import fields as F
from hybridflow.data.multimodal import rope_index
from hybridflow.inference.protocol import PromptImages


@dataclass(frozen=True)
class VisionTokens:
    """What placing a prompt's images needs from the model: its image pad token and the vision
    tower's spatial merge size (Qwen2-VL: ``config.image_token_id``,
    ``config.vision_config.spatial_merge_size``)."""

    image_token_id: int
    merge_size: int


def vision_tokens(config: Any) -> VisionTokens | None:
    """The model config's :class:`VisionTokens`; None for a model without a vision tower."""
    vision = getattr(config, "vision_config", None)
    token = getattr(config, "image_token_id", None)
    merge = getattr(vision, "spatial_merge_size", None)
    if vision is None or token is None or merge is None:
        return None
    return VisionTokens(int(token), int(merge))


def row_image_inputs(row: Mapping[str, Any]) -> Mapping[str, torch.Tensor] | None:
    """The row's image inputs (the object itself: rows repeated ×n share it), or None."""
    inputs = row.get(F.MULTI_MODAL_INPUTS)
    return inputs if inputs else None


def image_token_counts(grid_thw: torch.Tensor, vision: VisionTokens) -> list[int]:
    """Tokens per image: ``t·h·w / merge²`` of each ``image_grid_thw`` row."""
    return [int(t * h * w) // (vision.merge_size**2) for t, h, w in grid_thw.tolist()]


def expand_image_tokens(ids: Sequence[int], grid_thw: torch.Tensor, vision: VisionTokens) -> list[int]:
    """``ids`` with each single image pad token repeated as many times as its image's tokens
    (the chat template writes one per image; the processor expands them the same way)."""
    counts = image_token_counts(grid_thw, vision)
    pads = [i for i, token in enumerate(ids) if token == vision.image_token_id]
    if len(pads) != len(counts):
        raise ValueError(
            f"the rendered prompt holds {len(pads)} image tokens (id {vision.image_token_id}) for {len(counts)} "
            "images: the chat template must write one image pad per image part"
        )
    out: list[int] = []
    for token in ids:
        out += [token] * counts.pop(0) if token == vision.image_token_id else [token]
    return out


def prompt_images(
    ids: Sequence[int], inputs: Mapping[str, torch.Tensor], vision: VisionTokens | None, loop_name: str
) -> PromptImages:
    """The :class:`PromptImages` of a prompt whose image tokens are expanded: ``inputs`` and the
    prompt's 3-D positions. ``vision`` None (a context without a vision-language model) is an error."""
    if vision is None:
        raise ValueError(
            f"{loop_name} got a row with images but its context names no vision-language model "
            "(AgentContext.vision): the rollout's model has no vision tower, or the engine takes no images"
        )
    row = torch.tensor(list(ids), dtype=torch.long)
    positions = rope_index(
        row,
        torch.ones_like(row),
        inputs.get("image_grid_thw"),
        image_token_id=vision.image_token_id,
        spatial_merge_size=vision.merge_size,
    )
    return PromptImages(inputs=inputs, positions=positions)
