"""Which model families the lean decoder runs, and the per-family facts it needs.

The lean path reproduces each family's forward from the Hugging Face module's own parameters
(transformers 5.25's ``modeling_*`` files are the reference):

* **llama / qwen2 / mistral** — RMSNorm ``w · norm(x)``, SwiGLU MLP, one RoPE table;
* **qwen3** — the same plus an RMSNorm of every query and key head (over ``head_dim``) before
  RoPE;
* **gemma3 / gemma3_text** — the embedding scaled by √hidden, RMSNorm ``(1 + w) · norm(x)`` in
  fp32, GeGLU (``gelu_pytorch_tanh``) MLP, q/k norms, norms before *and after* attention and
  MLP, attention scores scaled by ``query_pre_attn_scalar^-½``, a RoPE table per layer type
  (local/global bases), and ``final_logit_softcapping`` on the logits.

Sliding-window layers (Gemma 3's local layers; Mistral's window; Qwen2/3 with
``use_sliding_window``) attend to the keys whose position is within ``sliding_window − 1`` of the
query's, as HF's mask does (``q − k < window``). What the lean path does not implement makes
:func:`lean_unsupported_reason` name it, and the HF decoder runs the model instead.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from hybridflow.inference.projections import linear_unsupported_reason

SUPPORTED_MODEL_TYPES: tuple[str, ...] = ("llama", "qwen2", "mistral", "qwen3", "gemma3", "gemma3_text")
GEMMA_TYPES: tuple[str, ...] = ("gemma3", "gemma3_text")
_QK_NORM_TYPES: tuple[str, ...] = ("qwen3", *GEMMA_TYPES)
_STATELESS_ROPE_TYPES: tuple[str, ...] = ("default", "linear", "llama3", "yarn")
_LAYER_TYPES: tuple[str, ...] = ("full_attention", "sliding_attention")

Norm = Callable[[torch.Tensor, torch.Tensor, float], torch.Tensor]


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Llama's RMSNorm: ``w · (x / rms(x))``, normalised in fp32 and cast back before the weight."""
    # torch's rms_norm runs HF's fp32 steps (mean of squares, + eps, rsqrt, scale) as one call.
    return weight * F.rms_norm(x.float(), (x.shape[-1],), eps=eps).to(x.dtype)


def offset_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Gemma's RMSNorm: ``(1 + w) · (x / rms(x))``, all in fp32, then cast back (HF's order)."""
    return (F.rms_norm(x.float(), (x.shape[-1],), eps=eps) * (1.0 + weight.float())).to(x.dtype)


@dataclass(frozen=True)
class FamilySpec:
    """What differs between the supported families, read once from the model's config."""

    gemma: bool  # scaled embedding, (1 + w) norms, sandwich norms, GeGLU, softcapped logits
    qk_norm: bool  # an RMSNorm over head_dim on every query and key head, before RoPE
    windows: tuple[int | None, ...]  # per layer: the sliding window, None for global attention
    rope_types: tuple[str | None, ...]  # per layer: the rotary_emb layer_type argument (Gemma)
    scale: float | None  # attention score scale; None = 1/√head_dim (SDPA's default)
    final_softcap: float | None  # logits ← cap · tanh(logits / cap)
    eps: float

    @property
    def norm(self) -> Norm:
        return offset_rms_norm if self.gemma else rms_norm


def _text_config(config: Any) -> Any:
    get_text_config = getattr(config, "get_text_config", None)
    return config if get_text_config is None else get_text_config()


def _layer_types(config: Any, model_type: str) -> list[str]:
    layers = int(config.num_hidden_layers)
    if model_type == "mistral":  # one window for every layer, when set
        kind = "full_attention" if getattr(config, "sliding_window", None) is None else "sliding_attention"
        return [kind] * layers
    types = getattr(config, "layer_types", None)
    return list(types) if types else ["full_attention"] * layers


def family_spec(config: Any) -> FamilySpec:
    """The :class:`FamilySpec` of a supported config (see :func:`lean_unsupported_reason`)."""
    model_type = config.model_type
    text = _text_config(config)
    gemma = model_type in GEMMA_TYPES
    kinds = _layer_types(text, model_type)
    window = getattr(text, "sliding_window", None)
    return FamilySpec(
        gemma=gemma,
        qk_norm=model_type in _QK_NORM_TYPES,
        windows=tuple(window if kind == "sliding_attention" else None for kind in kinds),
        rope_types=tuple(kinds) if gemma else (None,) * len(kinds),
        scale=float(text.query_pre_attn_scalar) ** -0.5 if gemma else None,
        final_softcap=getattr(text, "final_logit_softcapping", None) if gemma else None,
        eps=float(text.rms_norm_eps),
    )


def _rope_reason(text: Any, gemma: bool) -> str | None:
    rope = getattr(text, "rope_parameters", None) or {}
    if not isinstance(rope, dict):
        return None
    tables = [rope.get(kind) or {} for kind in _LAYER_TYPES] if gemma else [rope]
    for table in tables:
        rope_type = table.get("rope_type", "default")
        if rope_type not in _STATELESS_ROPE_TYPES:
            return f"rope_type {rope_type!r} depends on sequence length; not on the lean path"
    return None


def _config_reason(config: Any) -> str | None:
    model_type = getattr(config, "model_type", None)
    if config is None or model_type not in SUPPORTED_MODEL_TYPES:
        return f"model_type {model_type!r} is not one of {SUPPORTED_MODEL_TYPES}"
    text = _text_config(config)
    gemma = model_type in GEMMA_TYPES
    activation = getattr(text, "hidden_activation", None) if gemma else text.hidden_act
    if activation != ("gelu_pytorch_tanh" if gemma else "silu"):
        return f"the MLP activation {activation!r} of {model_type} is not on the lean path"
    if gemma and getattr(text, "attn_logit_softcapping", None) is not None:
        return "lean does not support gemma3 attention softcapping"
    if gemma and getattr(text, "use_bidirectional_attention", False):
        return "lean does not support gemma3 bidirectional attention"
    kinds = _layer_types(text, model_type)
    unknown = sorted(set(kinds) - set(_LAYER_TYPES))
    if unknown:
        return f"layer types {unknown} are not on the lean path"
    if "sliding_attention" in kinds and not getattr(text, "sliding_window", None):
        return "sliding_attention layers without a sliding_window"
    return _rope_reason(text, gemma)


def lean_unsupported_reason(model: nn.Module) -> str | None:
    """Why ``model`` (unwrapped from peft) cannot run on the lean path, or ``None`` when it can."""
    get_base_model = getattr(model, "get_base_model", None)
    model = model if get_base_model is None else get_base_model()
    reason = _config_reason(getattr(model, "config", None))
    if reason is not None:
        return reason
    inner = getattr(model, "model", None)
    if inner is None or not hasattr(inner, "layers") or not hasattr(model, "lm_head"):
        return "expected a *ForCausalLM with .model.layers and .lm_head"
    for name, module in model.named_modules():
        if name.endswith(("_proj", "lm_head")):
            reason = linear_unsupported_reason(module)
            if reason is not None:
                return f"{name}: {reason}"
    return None
