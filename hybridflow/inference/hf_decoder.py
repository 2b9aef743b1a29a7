"""The portable decoder: the Hugging Face model's own forward with a ``DynamicCache``.

Used for architectures the lean decoder does not cover (and for LoRA-wrapped modules). It
keeps the same interface as :class:`~hybridflow.inference.lean_decoder.LeanDecoder`
(prefill, decode, select_rows, release), so the sampling loop — early finish, compaction,
n samples per prompt — is identical on both paths; only the per-step forward differs. It is
the only decoder that takes images (:meth:`HFDecoder.prefill_multimodal`): a vision-language
model's prompt is prefilled once with its pixels, and decode steps feed text tokens at scalar
positions that the model spreads equally over its three rotary axes.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping

import torch
from torch import nn
from transformers import DynamicCache, PreTrainedConfig


class HFDecoder:
    """Prefill + one-token decode steps through ``model.forward``.

    ``dtype`` other than the module's runs the forward under ``torch.autocast`` (e.g. bf16
    sampling from an fp32 training module).
    """

    def __init__(self, model: nn.Module, dtype: torch.dtype | None = None) -> None:
        self.model = model
        param = next(model.parameters())
        self.autocast_dtype = dtype if dtype is not None and dtype != param.dtype else None
        self.device_type = param.device.type
        self.cache: DynamicCache | None = None
        self.attention_mask: torch.Tensor | None = None

    def _autocast(self) -> contextlib.AbstractContextManager:
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device_type, dtype=self.autocast_dtype)

    def refresh_weights(self) -> int:
        return 0  # reads the module's parameters at every step

    def invalidate_weights(self) -> None:
        pass

    def release(self) -> None:
        self.cache = None
        self.attention_mask = None

    def prefill(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor, max_len: int
    ) -> torch.Tensor:
        """Prompts (B, P), left-padded → float32 logits of the last position (B, V)."""
        return self._prefill(input_ids, attention_mask, position_ids, max_len, {})

    def prefill_multimodal(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        position_ids: torch.Tensor,
        max_len: int,
        images: Mapping[str, torch.Tensor],
    ) -> torch.Tensor:
        """A vision-language prefill: prompts (B, P) with per-axis positions ``(3, B, P)`` and the
        rows' image inputs (``pixel_values``, ``image_grid_thw``, concatenated in row order; may
        be empty) → float32 logits of the last position (B, V). The vision tower runs here, once;
        decode steps feed text tokens only."""
        if position_ids.dim() != 3 or position_ids.shape[0] != 3:
            raise ValueError(f"prefill_multimodal takes positions (3, B, P), got shape {tuple(position_ids.shape)}")
        return self._prefill(input_ids, attention_mask, position_ids, max_len, dict(images))

    def _prefill(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        position_ids: torch.Tensor,
        max_len: int,
        images: dict[str, torch.Tensor],
    ) -> torch.Tensor:
        if max_len < input_ids.shape[1]:
            raise ValueError(f"max_len {max_len} is shorter than the prompt length {input_ids.shape[1]}")
        config = self.model.config
        if not isinstance(config, PreTrainedConfig):
            raise TypeError(f"{type(self.model).__name__}.config is not a transformers PreTrainedConfig")
        self.cache = DynamicCache(config=config)
        self.attention_mask = attention_mask.long()
        with self._autocast():
            out = self.model(
                input_ids=input_ids,
                attention_mask=self.attention_mask,
                position_ids=position_ids,
                cache=self.cache,
                use_cache=True,
                logits_to_keep=1,
                **images,
            )
        return out.logits[:, -1].float()

    def decode(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """``tokens``, ``positions`` (rows,) → float32 logits (rows, V)."""
        if self.cache is None or self.attention_mask is None:
            raise RuntimeError("decode() before prefill()")
        self.attention_mask = torch.cat([self.attention_mask, self.attention_mask.new_ones(tokens.shape[0], 1)], dim=1)
        with self._autocast():
            out = self.model(
                input_ids=tokens[:, None],
                attention_mask=self.attention_mask,
                position_ids=positions[:, None],
                cache=self.cache,
                use_cache=True,
            )
        return out.logits[:, -1].float()

    def select_rows(self, index: torch.Tensor) -> None:
        if self.cache is None or self.attention_mask is None:
            raise RuntimeError("select_rows() before prefill()")
        self.cache.batch_select_indices(index)
        self.attention_mask = self.attention_mask.index_select(0, index)
