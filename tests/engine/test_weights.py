"""Weights for a rollout copy: HF names, tied tensors once, LoRA merged without touching the module."""

from __future__ import annotations

import torch
from peft import LoraConfig, get_peft_model

from hybridflow.engine.weights import iter_sync_weights
from hybridflow.models.tiny import build_tiny_model


def test_plain_model_yields_state_dict_names_once() -> None:
    model = build_tiny_model(seed=0)
    pairs = dict(iter_sync_weights(model))
    expected = set(model.state_dict()) - {"lm_head.weight"}  # tied to model.embed_tokens.weight
    assert set(pairs) == expected
    assert pairs["model.embed_tokens.weight"].data_ptr() == model.model.embed_tokens.weight.data_ptr()


def test_lora_model_yields_merged_weights_under_base_names() -> None:
    model = get_peft_model(build_tiny_model(seed=0), LoraConfig(r=4, lora_alpha=8, target_modules="all-linear"))
    with torch.no_grad():  # B starts at 0; make the adapters matter
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.1, generator=torch.Generator().manual_seed(len(name)))
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    pairs = dict(iter_sync_weights(model))
    # the module is untouched
    assert all(torch.equal(before[n], p) for n, p in model.named_parameters())
    merged = model.merge_and_unload()
    expected = {k: v for k, v in merged.state_dict().items() if k != "lm_head.weight"}
    assert set(pairs) == set(expected)
    for name, tensor in expected.items():
        torch.testing.assert_close(pairs[name], tensor, rtol=0, atol=1e-6, msg=name)
