"""A critic: the policy's decoder (no LM head) followed by a scalar value head.

``V(s_t) = w · h_t + b`` where ``h_t`` is the last hidden state at position t. Built from
the same folder as the policy so the critic starts from the policy's representations; the
head is seeded and small (std = the config's ``initializer_range``).

A vision-language folder (Qwen2-VL, Qwen2.5-VL) gives the same critic: ``AutoModel`` maps its
config to the base model under the conditional-generation class (vision tower + language model,
no LM head), whose forward takes the rows' ``pixel_values`` / ``image_grid_thw`` and (3, b, L)
rotary positions, so the values see the images as the actor's log-probs do. Its sizes are read
from the language model's config (``get_text_config``): the top-level config of such a model
has no ``hidden_size``.
"""

from __future__ import annotations

import os
from typing import Any

import torch
from torch import nn
from transformers import AutoModel, PreTrainedTokenizerBase

from hybridflow.models.loader import apply_lora, enable_gradient_checkpointing, load_pretrained, load_tokenizer
from hybridflow.models.sources import resolve_model_path


class ValueHeadModel(nn.Module):
    """``backbone`` (an HF base model returning hidden states) + ``v_head: Linear(hidden, 1)``.

    The head is kept in float32 whatever the backbone dtype: values are regressed onto
    returns, and bf16 rounding of the final projection is a needless source of noise.
    """

    def __init__(self, backbone: nn.Module, hidden_size: int, init_std: float, seed: int = 0) -> None:
        super().__init__()
        self.backbone = backbone
        self.v_head = nn.Linear(hidden_size, 1, dtype=torch.float32)
        generator = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            self.v_head.weight.copy_(torch.randn(self.v_head.weight.shape, generator=generator) * init_std)
            self.v_head.bias.zero_()

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        **kwargs: Any,
    ) -> torch.Tensor:
        """Values for every position: input_ids (B, L) → (B, L) float32. ``kwargs`` go to the
        backbone (``cu_seq_lens_q`` etc. of a packed micro-batch; a vision-language backbone's
        ``pixel_values`` and ``image_grid_thw``)."""
        out = self.backbone(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False, **kwargs
        )
        hidden = out.last_hidden_state.float()
        return self.v_head(hidden).squeeze(-1)


def load_value_model(
    path: str | os.PathLike,
    dtype: str | torch.dtype = "fp32",
    gradient_checkpointing: bool = False,
    lora_rank: int = 0,
    lora_alpha: float = 16,
    target_modules: str | list[str] = "all-linear",
    trust_remote_code: bool = False,
    seed: int = 0,
    attn_implementation: str | None = None,
) -> tuple[ValueHeadModel, PreTrainedTokenizerBase]:
    """``(critic, tokenizer)`` from a causal-LM or vision-language folder / known name (same
    options as the policy).

    With LoRA only the adapters and the value head are trainable.
    """
    folder = resolve_model_path(path)
    tokenizer = load_tokenizer(folder, trust_remote_code=trust_remote_code)
    backbone = load_pretrained(AutoModel, folder, dtype, trust_remote_code, attn_implementation)
    if gradient_checkpointing:
        enable_gradient_checkpointing(backbone)
    text_config = backbone.config.get_text_config()  # the config itself for a text model
    body: nn.Module = backbone
    if lora_rank > 0:
        body = apply_lora(backbone, lora_rank, lora_alpha, target_modules, task_type="FEATURE_EXTRACTION")
    model = ValueHeadModel(body, text_config.hidden_size, text_config.initializer_range, seed=seed)
    return model.eval(), tokenizer
