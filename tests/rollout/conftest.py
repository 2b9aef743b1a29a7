"""Fixtures for the rollout tests: the tiny tokenizer, tiny Llama / Qwen2 models, prompt batches."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from hybridflow.models.tiny import build_tiny_model, build_tiny_tokenizer

PROMPTS: tuple[str, ...] = (
    "What is 7 + 5?",
    "Hi",
    "The quick brown fox jumps over",
    "Compute 123 * 4 = 492, then",
)


@pytest.fixture(scope="session")
def tokenizer():
    tok = build_tiny_tokenizer()
    tok.padding_side = "left"
    return tok


@pytest.fixture(scope="session")
def tiny_llama(tokenizer):
    return build_tiny_model(tokenizer, arch="llama", num_layers=2, seed=0)


@pytest.fixture(scope="session")
def tiny_qwen2(tokenizer):
    # Qwen2 adds biases on q/k/v: the lean path must carry them through its fused projection.
    return build_tiny_model(tokenizer, arch="qwen2", num_layers=2, seed=1)


@pytest.fixture(scope="session")
def encode(tokenizer) -> Callable[..., dict[str, torch.Tensor]]:
    """texts → left-padded ``input_ids`` / ``attention_mask`` / ``position_ids``."""

    def _encode(texts=PROMPTS) -> dict[str, torch.Tensor]:
        enc = tokenizer(list(texts), return_tensors="pt", padding=True)
        mask = enc["attention_mask"]
        return {
            "input_ids": enc["input_ids"],
            "attention_mask": mask,
            "position_ids": (mask.cumsum(-1) - 1).clamp(min=0),
        }

    return _encode


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Run the rollout test modules on one intra-op thread (restored after each module).

    On a shared 2-core machine two OpenMP threads wait on each other whenever another process
    holds a core, which makes the many small steps of generation tests several times slower;
    correctness does not depend on the thread count (HF and our sampler run under the same one).
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
