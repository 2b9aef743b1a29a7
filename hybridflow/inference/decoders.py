"""Choosing the forward implementation the sampler steps: the lean decoder or the model's own.

Lives in ``inference/`` because both the trainer's rollout worker and the serving engine build
their decoder here; neither should reach into the other's floor for it.
"""

from __future__ import annotations

import logging

import torch
from torch import nn

from hybridflow.inference.generation import Decoder
from hybridflow.inference.hf_decoder import HFDecoder
from hybridflow.inference.lean_decoder import (
    LeanDecoder,
    lean_unsupported_reason,
    lean_view,
    unwrap_peft,
)
from hybridflow.inference.projections import is_lora_linear, packing_available

DECODERS: tuple[str, ...] = ("auto", "lean", "hf")

logger = logging.getLogger(__name__)


def decoder_unsupported_reason(model: nn.Module) -> str | None:
    """Why the lean decoder cannot run ``model`` (None: it can). A vision-language model is
    named as such: its prompts carry images, which only the HF decoder feeds to the vision tower."""
    config = getattr(model, "config", None)
    if getattr(config, "vision_config", None) is not None:
        kind = getattr(config, "model_type", type(model).__name__)
        return (
            f"{kind} is a vision-language model: the lean decoder has no vision tower and no per-axis "
            "(3-D) rotary positions; the HF decoder feeds its prompts' images"
        )
    return lean_unsupported_reason(model)


def build_decoder(
    model: nn.Module, decoder: str = "auto", weight_format: str = "auto", dtype: torch.dtype | None = None
) -> Decoder:
    """The forward implementation for ``model``, computing in ``dtype`` (default: the model's).

    ``decoder``: ``"lean"`` (error if unsupported), ``"hf"``, or ``"auto"`` (lean when the
    architecture allows; when it does not, one log line says so and why, e.g.
    ``decoder: hf (lean does not support gemma3 attention softcapping)``). ``weight_format``: ``"shared"``, ``"packed"``, or ``"auto"``
    (packed where oneDNN supports ``dtype`` on the model's device, where ``dtype`` differs
    from the model's, or where LoRA adapters must be merged; else shared). A ``peft`` model
    is unwrapped: its LoRA layers are merged into the packed weights (lean) or run as they are
    (hf).
    """
    if decoder not in DECODERS:
        raise ValueError(f"unknown decoder {decoder!r}; valid: {', '.join(DECODERS)}")
    model = unwrap_peft(model)
    reason = decoder_unsupported_reason(model)
    if decoder == "hf" or (decoder == "auto" and reason is not None):
        if decoder == "auto":
            logger.warning("decoder: hf (%s)", reason)
        return HFDecoder(model, dtype)
    if reason is not None:
        raise ValueError(f"decoder='lean' cannot run this model: {reason}")
    param = lean_view(model).get_input_embeddings().weight
    dtype = param.dtype if dtype is None else dtype
    if weight_format == "auto":
        needs_copy = dtype != param.dtype or any(is_lora_linear(m) for m in model.modules())
        weight_format = "packed" if needs_copy or packing_available(param.device, dtype) else "shared"
    return LeanDecoder(model, weight_format, dtype)
