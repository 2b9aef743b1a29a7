"""The weights a rollout engine needs, named as in the Hugging Face model folder.

A rollout in another process (or a server engine) holds a plain copy of the policy. After
each update the trainer streams ``(name, tensor)`` pairs from :func:`iter_sync_weights`:

* tensors shared by several names (tied embeddings) are yielded once, under the first name
  (``model.embed_tokens.weight``); the receiver's own tie covers ``lm_head.weight``;
* a LoRA model yields merged weights ``W + (α/r)·B·A`` under the base names, computed on the
  fly, so the trained module itself is never modified (merge/unmerge in place would drift
  the base weights by rounding every sync).

Tensors are detached views of the live parameters where no merge is needed: copy them
before the next optimizer step if they must outlive it.

A sharded module (FSDP2: parameters are DTensors holding this rank's rows) passes
``gather`` — e.g. ``DTensor.full_tensor`` — which turns each tensor into the full one; it
is a collective, so every rank must iterate the same pairs in the same order.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import torch
from torch.distributed.tensor import DTensor

if TYPE_CHECKING:
    from peft.tuners.lora import LoraLayer

_BASE_LAYER = ".base_layer."


def iter_sync_weights(
    module: torch.nn.Module, gather: Callable[[torch.Tensor], torch.Tensor] | None = None
) -> Iterator[tuple[str, torch.Tensor]]:
    """``(name, tensor)`` for every distinct weight of ``module`` (LoRA merged).

    ``gather`` (default: none) maps a stored tensor to the full tensor of that name; it is
    applied to base weights and to LoRA deltas before they are added.
    """
    inner, lora_layers = _unwrap_peft(module)
    full = gather if gather is not None else _identity
    seen: set[tuple[int, ...]] = set()
    with torch.no_grad():
        for name, tensor in inner.state_dict(keep_vars=True).items():
            if ".lora_" in name:
                continue
            ident = _storage_ident(tensor)
            if tensor.numel() and ident in seen:
                continue
            seen.add(ident)
            value = full(tensor)
            if _BASE_LAYER in name:
                owner, leaf = name.split(_BASE_LAYER, 1)
                name = f"{owner}.{leaf}"
                if leaf == "weight" and owner in lora_layers:
                    value = value + full(_lora_delta(lora_layers[owner])).to(value.dtype)
            yield name, value.detach()


def _identity(tensor: torch.Tensor) -> torch.Tensor:
    return tensor


def _storage_ident(tensor: torch.Tensor) -> tuple[int, ...]:
    """Where a tensor's data lives. A DTensor is identified by the parameter object itself:
    its local shard may be empty, and every rank must take the same decision (tied weights
    are one parameter object on every rank)."""
    if isinstance(tensor, DTensor):
        return (id(tensor),)
    return (tensor.untyped_storage().data_ptr(), tensor.storage_offset(), *tensor.shape)


def _unwrap_peft(module: torch.nn.Module) -> tuple[torch.nn.Module, dict[str, LoraLayer]]:
    """(the HF model inside a PeftModel, its LoRA layers by module name); plain modules pass."""
    try:
        from peft import PeftModel
        from peft.tuners.lora import LoraLayer
    except ImportError:  # peft absent: nothing can be a PeftModel
        return module, {}
    if not isinstance(module, PeftModel):
        return module, {}
    inner = module.get_base_model()
    layers = {name: m for name, m in inner.named_modules() if isinstance(m, LoraLayer)}
    return inner, layers


def _lora_delta(layer: LoraLayer) -> torch.Tensor:
    """Σ over active adapters of the layer's weight delta (0 if merged or disabled)."""
    base = layer.get_base_layer().weight
    assert isinstance(base, torch.Tensor), f"{type(layer).__name__}'s base layer has no weight tensor"
    delta = torch.zeros_like(base)
    if layer.merged or layer.disable_adapters:
        return delta
    for adapter in layer.active_adapters:
        if adapter in layer.lora_A:
            # every concrete LoRA layer (Linear, Embedding, Conv) defines it; the LoraLayer mixin does not declare it
            delta = delta + layer.get_delta_weight(adapter)  # type: ignore[attr-defined]
    return delta
