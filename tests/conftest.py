"""Shared fixtures for the whole suite: offline switches, one tiny model folder, rollout rows."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

# Nothing in the tests may reach the Hugging Face hub: a missing file must fail at once.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"

TINY_EOS_ID = 2  # <|im_end|> in the tiny tokenizer
TINY_PAD_ID = 3


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An HF folder (config + safetensors + tokenizer) of a 2-layer, hidden-128 tiny llama."""
    from hybridflow.models.tiny import save_tiny_model

    return save_tiny_model(tmp_path_factory.mktemp("tiny") / "tiny-llama", arch="llama", seed=0)


def _rollout_batch(num_rows: int = 8, prompt_len: int = 6, response_len: int = 5, seed: int = 0) -> Any:
    import torch

    from hybridflow import fields as FK
    from hybridflow.protocol import DataProto

    g = torch.Generator().manual_seed(seed)
    prompts = torch.full((num_rows, prompt_len), TINY_PAD_ID)
    responses = torch.full((num_rows, response_len), TINY_PAD_ID)
    attention = torch.zeros(num_rows, prompt_len + response_len, dtype=torch.long)
    for i in range(num_rows):
        p = int(torch.randint(1, prompt_len + 1, (1,), generator=g))
        r = int(torch.randint(1, response_len + 1, (1,), generator=g))
        prompts[i, prompt_len - p :] = torch.randint(4, 500, (p,), generator=g)
        responses[i, :r] = torch.randint(4, 500, (r,), generator=g)
        if r < response_len:
            responses[i, r - 1] = TINY_EOS_ID
        attention[i, prompt_len - p : prompt_len + r] = 1
    mask = attention[:, prompt_len:].float()
    positions = (attention.cumsum(dim=-1) - 1).clamp(min=0)
    tensors = {
        FK.PROMPTS: prompts,
        FK.RESPONSES: responses,
        FK.INPUT_IDS: torch.cat([prompts, responses], dim=1),
        FK.ATTENTION_MASK: attention,
        FK.POSITION_IDS: positions,
        FK.RESPONSE_MASK: mask,
        FK.ADVANTAGES: torch.randn(num_rows, response_len, generator=g) * mask,
        FK.RETURNS: torch.randn(num_rows, response_len, generator=g) * mask,
        FK.VALUES: torch.randn(num_rows, response_len, generator=g) * 0.1 * mask,
    }
    return DataProto.from_dict(tensors=tensors)


@pytest.fixture(scope="session")
def make_rollout_batch() -> Callable[..., Any]:
    """``make_rollout_batch(num_rows=8, prompt_len=6, response_len=5, seed=0)`` → a DataProto laid
    out like a rollout: prompts left-padded, responses right-padded (an EOS ends the short
    ones), position ids over real tokens, random advantages / returns / values × mask."""
    return _rollout_batch
