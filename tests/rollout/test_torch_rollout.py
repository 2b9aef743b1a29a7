"""``TorchRollout`` (name ``torch``): verl's output fields, n, validation kwargs, seeds, errors."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from hybridflow.config.actor_rollout_ref import RolloutConfig, ValKwargsConfig
from hybridflow.protocol import DataProto
from hybridflow.workers.rollout import ROLLOUTS, TorchRollout, get_rollout_class

PAD = 3


def _config(**kwargs) -> RolloutConfig:
    base = replace(RolloutConfig(), response_length=8, seed=0, do_sample=False)
    return replace(base, **kwargs)


def _data(prompts, meta=None, non_tensors=None) -> DataProto:
    return DataProto.from_dict(tensors=dict(prompts), non_tensors=non_tensors, meta_info=meta or {})


def _full_log_probs(model, out: DataProto) -> torch.Tensor:
    batch = out.batch
    with torch.no_grad():
        logits = model(
            input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], position_ids=batch["position_ids"]
        ).logits.float()
    plen, steps = batch["prompts"].shape[1], batch["responses"].shape[1]
    log_probs = torch.log_softmax(logits[:, plen - 1 : plen + steps - 1], dim=-1)
    return log_probs.gather(-1, batch["responses"][..., None])[..., 0]


def test_registry_knows_torch_and_names_valid_choices():
    assert get_rollout_class("torch") is TorchRollout
    with pytest.raises(ValueError, match="unknown rollout 'vllm_typo'; valid names: .*torch"):
        ROLLOUTS.get("vllm_typo")


def test_output_fields_follow_verl_layout(tiny_llama, tokenizer, encode):
    prompts = encode()
    rollout = TorchRollout(_config(), tiny_llama, tokenizer)
    free = rollout.generate_sequences(_data(prompts, {"eos_token_id": []})).batch["responses"]
    stop = int(free[0, 2])
    first = int((free[0] == stop).nonzero()[0])  # the stop token may already occur earlier
    out = rollout.generate_sequences(_data(prompts, {"eos_token_id": stop, "pad_token_id": PAD}))
    batch = out.batch
    plen, steps = prompts["input_ids"].shape[1], 8
    assert batch["responses"].shape == (4, steps) and batch["input_ids"].shape == (4, plen + steps)
    assert torch.equal(batch["prompts"], prompts["input_ids"])
    assert batch["responses"][0, : first + 1].tolist() == free[0, : first + 1].tolist()
    assert (batch["responses"][0, first + 1 :] == PAD).all()
    expected_mask = torch.zeros(steps, dtype=torch.long)
    expected_mask[: first + 1] = 1
    assert torch.equal(batch["response_mask"][0], expected_mask)
    for row in range(4):  # every row: mask is 1 exactly up to and including its first stop
        hits = (batch["responses"][row] == stop).nonzero()
        length = int(hits[0]) + 1 if hits.numel() else steps
        assert batch["response_mask"][row].sum().item() == length
    assert torch.equal(batch["input_ids"], torch.cat([prompts["input_ids"], batch["responses"]], 1))
    assert torch.equal(batch["attention_mask"], torch.cat([prompts["attention_mask"], batch["response_mask"]], 1))
    last = prompts["position_ids"][:, -1:]
    assert torch.equal(batch["position_ids"][:, plen:], last + torch.arange(1, steps + 1))
    assert torch.equal(batch["position_ids"][:, :plen], prompts["position_ids"])
    mask = batch["response_mask"].bool()
    assert (batch["rollout_log_probs"][~mask] == 0).all()
    diff = (batch["rollout_log_probs"] - _full_log_probs(tiny_llama, out))[mask].abs().max().item()
    assert diff < 1e-5


def test_n_samples_repeat_prompts_and_non_tensor_columns(tiny_llama, tokenizer, encode):
    prompts = encode()
    rollout = TorchRollout(_config(do_sample=True), tiny_llama, tokenizer)
    uids = np.array(["a", "b", "c", "d"], dtype=object)
    out = rollout.generate_sequences(_data(prompts, {"n": 3}, {"uid": uids}))
    assert len(out) == 12
    assert out.non_tensor_batch["uid"].tolist() == ["a"] * 3 + ["b"] * 3 + ["c"] * 3 + ["d"] * 3
    assert torch.equal(out.batch["prompts"], prompts["input_ids"].repeat_interleave(3, dim=0))
    assert out.meta_info == {"n": 3}
    responses = out.batch["responses"].view(4, 3, -1)
    assert any(not torch.equal(responses[i, 0], responses[i, 1]) for i in range(4))  # samples differ


def test_validate_uses_val_kwargs(tiny_llama, tokenizer, encode):
    prompts = encode()
    sampling = TorchRollout(_config(do_sample=True, temperature=1.5), tiny_llama, tokenizer)
    greedy = TorchRollout(_config(do_sample=False), tiny_llama, tokenizer)
    reference = greedy.generate_sequences(_data(prompts)).batch["responses"]
    validated = sampling.generate_sequences(_data(prompts, {"validate": True})).batch["responses"]
    assert torch.equal(validated, reference)  # val_kwargs default: do_sample=False
    val_sampling = replace(_config(), val_kwargs=ValKwargsConfig(do_sample=True, temperature=1.0))
    sampled = TorchRollout(val_sampling, tiny_llama, tokenizer).generate_sequences(_data(prompts, {"validate": True}))
    assert not torch.equal(sampled.batch["responses"], reference)


def test_meta_overrides_and_seeds_make_sampling_reproducible(tiny_llama, tokenizer, encode):
    prompts = encode()
    config = _config(do_sample=True, seed=7)
    a = TorchRollout(config, tiny_llama, tokenizer).generate_sequences(_data(prompts)).batch["responses"]
    b = TorchRollout(config, tiny_llama, tokenizer).generate_sequences(_data(prompts)).batch["responses"]
    assert torch.equal(a, b)
    rollout = TorchRollout(config, tiny_llama, tokenizer)
    s1 = rollout.generate_sequences(_data(prompts, {"seed": 11})).batch["responses"]
    s2 = rollout.generate_sequences(_data(prompts, {"seed": 11})).batch["responses"]
    s3 = rollout.generate_sequences(_data(prompts, {"seed": 12})).batch["responses"]
    assert torch.equal(s1, s2) and not torch.equal(s1, s3)
    greedy = rollout.generate_sequences(_data(prompts, {"do_sample": False, "response_length": 5}))
    assert greedy.batch["responses"].shape == (4, 5)


def _peaked_model(tokenizer):
    from hybridflow.models.tiny import build_tiny_model

    model = build_tiny_model(tokenizer, arch="llama", num_layers=2, seed=3)
    with torch.no_grad():
        model.model.norm.weight.mul_(5.0)  # sharpen: top token ~0.2, a long tail of small ones
    return model


def _check_frequencies(tokens: torch.Tensor, probs: torch.Tensor) -> None:
    rows = tokens.numel()
    freq = torch.bincount(tokens, minlength=probs.numel()).double() / rows
    probs = probs.double()
    assert (freq[probs == 0] == 0).all()  # nothing outside the kept set is ever drawn
    tolerance = 4.5 * (probs * (1 - probs) / rows).sqrt() + 1e-3
    assert ((freq - probs).abs() <= tolerance).all(), (freq - probs).abs().max()


@pytest.mark.parametrize(
    "temperature, top_k, top_p", [(1.0, -1, 1.0), (0.7, -1, 1.0), (1.0, 5, 1.0), (1.2, -1, 0.8), (1.0, 8, 0.9)]
)
def test_sampling_distribution_matches_model(tokenizer, encode, temperature, top_k, top_p):
    model = _peaked_model(tokenizer)
    prompts = encode(["What is 7 + 5?"])
    config = _config(do_sample=True, temperature=temperature, top_k=top_k, top_p=top_p, response_length=2, seed=5)
    out = TorchRollout(config, model, tokenizer).generate_sequences(_data(prompts, {"n": 4000, "eos_token_id": []}))
    responses = out.batch["responses"]
    with torch.no_grad():
        logits = model(**prompts).logits[0, -1] / temperature
    _check_frequencies(responses[:, 0], _kept_probs(logits, top_k, top_p))
    # Second token, conditioned on the most frequent first token: exercises the decode step
    # on cache rows fanned out from one prefill.
    first = int(torch.mode(responses[:, 0]).values)
    rows = responses[:, 0] == first
    ids = torch.cat([prompts["input_ids"], torch.tensor([[first]])], 1)
    with torch.no_grad():
        logits2 = model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits[0, -1] / temperature
    _check_frequencies(responses[rows, 1], _kept_probs(logits2, top_k, top_p))


def _kept_probs(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Reference warpers written independently: sort, cut top-k, cut the nucleus, renormalise."""
    order = logits.argsort(descending=True)
    keep = torch.ones_like(logits, dtype=torch.bool)
    if top_k > 0:
        keep[order[top_k:]] = False
    probs = torch.where(keep, logits, torch.tensor(float("-inf"))).softmax(-1)
    if top_p < 1.0:
        cumulative = 0.0
        for index in order.tolist():
            if cumulative >= top_p:
                keep[index] = False
            cumulative += float(probs[index])
    probs = torch.where(keep, logits, torch.tensor(float("-inf"))).softmax(-1)
    return probs


def test_bf16_sampling_from_fp32_module(tiny_llama, tokenizer, encode):
    prompts = encode()
    rollout = TorchRollout(_config(), tiny_llama, tokenizer, dtype="bf16")
    assert rollout.decoder.weight_format == "packed" and rollout.decoder.dtype == torch.bfloat16
    out = rollout.generate_sequences(_data(prompts))
    diff = (out.batch["rollout_log_probs"] - _full_log_probs(tiny_llama, out)).abs().max().item()
    assert diff < 0.1  # bf16 numerics against the fp32 module: close, not exact


def test_bad_inputs_give_clear_errors(tiny_llama, tokenizer, encode):
    prompts = encode()
    with pytest.raises(ValueError, match="prompt length 15 exceeds rollout.prompt_length=8"):
        TorchRollout(_config(prompt_length=8), tiny_llama, tokenizer).generate_sequences(_data(prompts))
    rollout = TorchRollout(_config(), tiny_llama, tokenizer)
    with pytest.raises(ValueError, match=r"max_position_embeddings=1024"):
        rollout.generate_sequences(_data(prompts, {"response_length": 1020}))
    with pytest.raises(ValueError, match=r"needs batch\['position_ids'\]"):
        rollout.generate_sequences(_data({k: v for k, v in prompts.items() if k != "position_ids"}))
    with pytest.raises(ValueError, match="eos_token_id'\\] must be an int or a list of ints"):
        rollout.generate_sequences(_data(prompts, {"eos_token_id": "</s>"}))
    with pytest.raises(ValueError, match="rollout.response_length is null"):
        TorchRollout(replace(RolloutConfig(), response_length=None), tiny_llama, tokenizer)
    with pytest.raises(ValueError, match="unknown rollout dtype 'fp16'"):
        TorchRollout(_config(), tiny_llama, tokenizer, dtype="fp16")
