"""Reward models: a Hugging Face sequence-classification model with one output, read at the
last valid token of each row.

``r(x, y) = w · h_last + b`` where ``h_last`` is the decoder's last hidden state at the final
attended position of prompt + response. The score is taken from the attention mask, not from
HF's own pooling (which looks for the last token that is not ``pad_token_id`` and so skips
a trailing eos when pad = eos, as in SmolLM2).

Two ways in:

- :func:`load_reward_model` — a trained RM folder (``AutoModelForSequenceClassification``,
  ``num_labels = 1``), e.g. one exported by ``hybridflow rm``.
- :func:`reward_model_from_lm` — a new RM built from a causal LM folder: its decoder plus a
  fresh seeded head (what ``hybridflow rm`` starts from).
"""

from __future__ import annotations

import os
from typing import Any

import torch
from torch import nn
from transformers import AutoConfig, AutoModelForSequenceClassification, PreTrainedModel, PreTrainedTokenizerBase

from hybridflow.models.loader import WEIGHT_LOAD_ERRORS, ModelLoadError, load_pretrained, load_tokenizer
from hybridflow.models.sources import resolve_model_path

HEAD_NAMES = ("score", "classifier")  # the 1-output head's attribute in HF *ForSequenceClassification classes
# a checkpoint whose state dict lacks the head's keys raises KeyError in some transformers versions
_LOAD_ERRORS: tuple[type[BaseException], ...] = (*WEIGHT_LOAD_ERRORS, KeyError)


def _from_pretrained(
    folder: os.PathLike,
    dtype: str | torch.dtype,
    trust_remote_code: bool,
    attn_implementation: str | None,
    **kwargs: Any,
) -> PreTrainedModel:
    return load_pretrained(
        AutoModelForSequenceClassification, folder, dtype, trust_remote_code, attn_implementation,
        "a sequence-classification reward model", _LOAD_ERRORS, **kwargs,
    )  # fmt: skip


def load_reward_model(
    path: str | os.PathLike,
    dtype: str | torch.dtype = "fp32",
    trust_remote_code: bool = False,
    attn_implementation: str | None = None,
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """``(model, tokenizer)`` of a trained reward-model folder, in eval mode.

    Raises :class:`ModelLoadError` if the folder is not a sequence-classification model with
    exactly one output (a causal LM folder would load with a random head and score noise).
    """
    folder = resolve_model_path(path)
    try:
        config = AutoConfig.from_pretrained(folder, local_files_only=True, trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as err:
        raise ModelLoadError(f"could not read the reward model's config in {folder}: {err}") from err
    architectures = list(getattr(config, "architectures", None) or [])
    if not any(a.endswith("ForSequenceClassification") for a in architectures):
        raise ModelLoadError(
            f"{folder} is not a reward model: its architectures are {architectures or 'unset'}, expected a "
            "*ForSequenceClassification with one output (train one with `hybridflow rm`)"
        )
    if config.num_labels != 1:
        raise ModelLoadError(
            f"{folder}: a reward model has one output (num_labels=1), this one has {config.num_labels}"
        )
    tokenizer = load_tokenizer(folder, trust_remote_code=trust_remote_code)
    model = _from_pretrained(folder, dtype, trust_remote_code, attn_implementation)
    model.config.pad_token_id = tokenizer.pad_token_id
    return model.eval(), tokenizer


def reward_model_from_lm(
    path: str | os.PathLike,
    dtype: str | torch.dtype = "fp32",
    seed: int = 0,
    trust_remote_code: bool = False,
    attn_implementation: str | None = None,
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """A new reward model from a causal LM folder / known name: its decoder and a fresh head,
    ``N(0, initializer_range²)`` from ``seed`` (the head is the only new weight; the LM head is dropped)."""
    folder = resolve_model_path(path)
    tokenizer = load_tokenizer(folder, trust_remote_code=trust_remote_code)
    model = _from_pretrained(folder, dtype, trust_remote_code, attn_implementation, num_labels=1)
    head = score_head(model)
    weight, bias = head.weight, getattr(head, "bias", None)
    assert isinstance(weight, torch.Tensor), f"{type(head).__name__}.weight is not a tensor"
    generator = torch.Generator().manual_seed(seed)
    std = float(getattr(model.config, "initializer_range", 0.02))
    with torch.no_grad():
        weight.copy_(torch.randn(weight.shape, generator=generator) * std)
        if bias is not None:
            bias.zero_()
    model.config.pad_token_id = tokenizer.pad_token_id
    return model.eval(), tokenizer


def _unwrapped(model: nn.Module) -> nn.Module:
    """The HF model under a peft wrapper (LoRA layers are injected in place, so they still run)."""
    get_base = getattr(model, "get_base_model", None)
    return get_base() if callable(get_base) else model


def score_head(model: nn.Module) -> nn.Module:
    """The model's 1-output head (``score`` or ``classifier``; peft's trainable copy under LoRA)."""
    base = _unwrapped(model)
    for name in HEAD_NAMES:
        head = getattr(base, name, None)
        if isinstance(head, nn.Module):
            return head
    raise ModelLoadError(f"{type(base).__name__} has no head named {' or '.join(HEAD_NAMES)}")


def decoder(model: nn.Module) -> nn.Module:
    """The transformer under the head (``model.model`` for Llama/Qwen2/Mistral)."""
    base = _unwrapped(model)
    prefix = base.base_model_prefix  # a class attribute of every PreTrainedModel
    assert isinstance(prefix, str), f"{type(base).__name__}.base_model_prefix is not an attribute name"
    return getattr(base, prefix)


def last_index(attention_mask: torch.Tensor) -> torch.Tensor:
    """``(B,)`` position of each row's last attended token (0 for an all-zero row)."""
    positions = torch.arange(attention_mask.shape[-1], device=attention_mask.device).expand_as(attention_mask)
    return (positions * (attention_mask > 0)).max(dim=-1).values


def token_scores(model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """The head at every position: ``(B, L)`` float32 (right or left padding)."""
    position_ids = torch.clamp(attention_mask.long().cumsum(-1) - 1, min=0)
    hidden = decoder(model)(
        input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False
    ).last_hidden_state
    return score_head(model)(hidden).float().squeeze(-1)


def last_token_scores(model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """``(B,)`` float32: the reward of each row, the head at its last attended token."""
    scores = token_scores(model, input_ids, attention_mask)
    return scores[torch.arange(len(scores), device=scores.device), last_index(attention_mask)]
