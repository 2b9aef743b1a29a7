"""Fixtures for the reward tests: the tiny tokenizer and a post-rollout batch builder."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hybridflow.protocol import DataProto


@pytest.fixture(scope="session")
def tokenizer():
    from hybridflow.models.tiny import build_tiny_tokenizer

    return build_tiny_tokenizer()


def build_batch(tokenizer, responses, ground_truths, data_sources=None, prompts=None, width=None, eos=True, mask="attention"):
    """A DataProto as rollout leaves it: left-padded prompts, right-padded responses (+ eos)."""
    n = len(responses)
    prompts = prompts or [f"question {i}" for i in range(n)]
    data_sources = data_sources or ["hybridflow/arithmetic"] * n
    pad = tokenizer.pad_token_id
    p_ids = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts]
    r_ids = [tokenizer(r, add_special_tokens=False)["input_ids"] + ([tokenizer.eos_token_id] if eos else []) for r in responses]
    P = max(len(x) for x in p_ids)
    T = width or max(len(x) for x in r_ids)
    prompt_t = torch.tensor([[pad] * (P - len(x)) + x for x in p_ids])
    resp_t = torch.tensor([x + [pad] * (T - len(x)) for x in r_ids])
    p_mask = torch.tensor([[0] * (P - len(x)) + [1] * len(x) for x in p_ids])
    r_mask = torch.tensor([[1] * len(x) + [0] * (T - len(x)) for x in r_ids])
    tensors = {"prompts": prompt_t, "responses": resp_t, "input_ids": torch.cat([prompt_t, resp_t], 1)}
    if mask == "attention":
        tensors["attention_mask"] = torch.cat([p_mask, r_mask], 1)
    else:
        tensors["response_mask"] = r_mask
    non_tensors = {
        "data_source": np.array(data_sources, dtype=object),
        "reward_model": np.array([{"style": "rule", "ground_truth": g} for g in ground_truths], dtype=object),
        "extra_info": np.array([{"index": i} for i in range(n)], dtype=object),
    }
    return DataProto.from_dict(tensors=tensors, non_tensors=non_tensors), [len(x) for x in r_ids]


@pytest.fixture
def make_batch(tokenizer):
    def make(*args, **kwargs):
        return build_batch(tokenizer, *args, **kwargs)

    return make
