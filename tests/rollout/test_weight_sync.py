"""Weight sync: bucketing, loading by name, the colocated (shared) and separate cases."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from hybridflow.config.actor_rollout_ref import RolloutConfig
from hybridflow.inference.weights import load_named_tensors
from hybridflow.models.tiny import build_tiny_model
from hybridflow.protocol import DataProto
from hybridflow.workers.rollout import TorchRollout, iter_weight_buckets


def _config() -> RolloutConfig:
    return replace(RolloutConfig(), response_length=8, seed=0, do_sample=False)


def _greedy(rollout: TorchRollout, prompts) -> DataProto:
    return rollout.generate_sequences(DataProto.from_dict(tensors=dict(prompts)))


def test_buckets_respect_the_byte_budget():
    sizes = {"a": 4, "b": 4, "c": 4, "d": 12, "e": 4}  # float32 elements: 16, 16, 16, 48, 16 bytes
    pairs = [(name, torch.zeros(n)) for name, n in sizes.items()]
    buckets = [[name for name, _ in bucket] for bucket in iter_weight_buckets(pairs, bucket_bytes=40)]
    assert buckets == [["a", "b"], ["c"], ["d"], ["e"]]  # d (48 B) exceeds the budget: travels alone
    with pytest.raises(ValueError, match="bucket_bytes must be >= 1"):
        list(iter_weight_buckets(pairs, 0))


def test_load_named_tensors_copies_and_skips_own_tensors(tiny_llama, tokenizer):
    target = build_tiny_model(tokenizer, arch="llama", num_layers=2, seed=9)
    source = dict(tiny_llama.named_parameters())
    assert load_named_tensors(target, source) == len(source)
    assert all(torch.equal(p, source[n]) for n, p in target.named_parameters())
    assert load_named_tensors(target, target.named_parameters()) == 0  # its own tensors: nothing copied


def test_load_named_tensors_names_bad_entries(tiny_llama):
    with pytest.raises(ValueError, match=r"no tensor named 'layers.0.mlp.up_proj.weight'; similar names: \['model.layers.0"):
        load_named_tensors(tiny_llama, [("layers.0.mlp.up_proj.weight", torch.zeros(256, 128))])
    with pytest.raises(ValueError, match=r"'model.norm.weight' has shape \(3,\), the rollout model expects \(128,\)"):
        load_named_tensors(tiny_llama, {"model.norm.weight": torch.zeros(3)})


def test_separate_rollout_receives_pushed_buckets(tiny_llama, tokenizer, encode):
    prompts = encode()
    own_copy = build_tiny_model(tokenizer, arch="llama", num_layers=2, seed=9)
    rollout = TorchRollout(_config(), own_copy, tokenizer, weight_format="packed")
    before = _greedy(rollout, prompts).batch["responses"]  # packs the old weights
    expected = _greedy(TorchRollout(_config(), tiny_llama, tokenizer), prompts).batch["responses"]
    assert not torch.equal(before, expected)
    # Tied weights travel once, as the engine's iter_sync_weights sends them.
    pairs = [(n, p.detach()) for n, p in tiny_llama.named_parameters()]
    for bucket in iter_weight_buckets(pairs, bucket_bytes=64 * 1024):
        rollout.update_weights(bucket)
    assert torch.equal(_greedy(rollout, prompts).batch["responses"], expected)


@pytest.mark.parametrize(
    "make_optimizer",
    [
        lambda params: torch.optim.SGD(params, lr=0.5),  # foreach: bumps version counters
        lambda params: torch.optim.AdamW(params, lr=0.02, fused=True),  # fused: does not
    ],
    ids=["sgd", "fused-adamw"],
)
def test_colocated_rollout_sees_optimizer_steps_without_a_push(tokenizer, encode, make_optimizer):
    model = build_tiny_model(tokenizer, arch="llama", num_layers=2, seed=4)
    prompts = encode()
    rollout = TorchRollout(_config(), model, tokenizer, weight_format="packed")
    before = _greedy(rollout, prompts).batch["rollout_log_probs"]
    optimizer = make_optimizer(model.parameters())
    for p in model.parameters():
        p.grad = torch.randn_like(p) * 0.05
    optimizer.step()
    out = _greedy(rollout, prompts)
    with torch.no_grad():
        logits = model(
            input_ids=out.batch["input_ids"],
            attention_mask=out.batch["attention_mask"],
            position_ids=out.batch["position_ids"],
        ).logits
    plen = prompts["input_ids"].shape[1]
    reference = torch.log_softmax(logits[:, plen - 1 : -1], -1).gather(-1, out.batch["responses"][..., None])[..., 0]
    assert not torch.allclose(before, out.batch["rollout_log_probs"])
    assert (out.batch["rollout_log_probs"] - reference).abs().max().item() < 1e-5


def test_release_then_generate_again(tiny_llama, tokenizer, encode):
    prompts = encode()
    rollout = TorchRollout(_config(), tiny_llama, tokenizer, weight_format="packed")
    first = _greedy(rollout, prompts).batch["responses"]
    rollout.release()
    assert rollout.decoder.cache is None
    assert all(p.packed_bytes() == 0 for p in rollout.decoder.projections())
    rollout.resume()
    assert torch.equal(_greedy(rollout, prompts).batch["responses"], first)
