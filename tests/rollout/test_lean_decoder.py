"""The lean decoder and the HF fallback against Hugging Face ``generate`` / full forward passes."""

from __future__ import annotations

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel

from hybridflow.inference.decoders import build_decoder
from hybridflow.inference.generation import generate
from hybridflow.inference.hf_decoder import HFDecoder
from hybridflow.inference.lean_decoder import LeanDecoder, lean_unsupported_reason
from hybridflow.inference.sampling import GenerationParams
from hybridflow.models.tiny import build_tiny_model
from tests.numerics import TINY_DEPTH, TINY_WIDTH, assert_greedy_tokens_match

STEPS = 16


def _hf_greedy_with_logits(model, prompts, steps=STEPS) -> tuple[torch.Tensor, torch.Tensor]:
    with torch.inference_mode():
        out = model.generate(
            input_ids=prompts["input_ids"],
            attention_mask=prompts["attention_mask"],
            max_new_tokens=steps,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=3,
            output_logits=True,
            return_dict_in_generate=True,
        )
    return out.sequences[:, prompts["input_ids"].shape[1] :], torch.stack(out.logits, dim=1)


def _assert_greedy_equals_hf(responses, model, prompts, steps=STEPS) -> None:
    """Our greedy tokens are HF ``generate``'s; another backend (other kernels) may break only a
    near tie of HF's logits the other way (tests/numerics.py)."""
    tokens, logits = _hf_greedy_with_logits(model, prompts, steps)
    assert_greedy_tokens_match(responses, tokens, logits, dtype=torch.float32, reduction_size=TINY_WIDTH,
                               depth=TINY_DEPTH, what="greedy tokens vs HF generate")


def _ours_greedy(decoder, prompts, steps=STEPS):
    params = GenerationParams(max_new_tokens=steps, do_sample=False)
    return generate(decoder, prompts["input_ids"], prompts["attention_mask"], prompts["position_ids"], params, 3)


def _full_forward_log_probs(model, prompts, responses):
    ids = torch.cat([prompts["input_ids"], responses], dim=1)
    mask = torch.cat([prompts["attention_mask"], torch.ones_like(responses)], dim=1)
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask, position_ids=pos).logits.float()
    plen = prompts["input_ids"].shape[1]
    log_probs = torch.log_softmax(logits[:, plen - 1 : -1], dim=-1)
    return log_probs.gather(-1, responses[..., None])[..., 0]


@pytest.mark.parametrize("arch", ["tiny_llama", "tiny_qwen2"])
@pytest.mark.parametrize("weight_format", ["shared", "packed"])
def test_lean_greedy_equals_hf_generate_and_log_probs_match(request, encode, arch, weight_format):
    model = request.getfixturevalue(arch)
    prompts = encode()
    out = _ours_greedy(LeanDecoder(model, weight_format), prompts)
    _assert_greedy_equals_hf(out.responses, model, prompts)
    reference = _full_forward_log_probs(model, prompts, out.responses)
    assert (out.log_probs - reference).abs().max().item() < 1e-5


def test_hf_decoder_greedy_equals_hf_generate(tiny_llama, encode):
    prompts = encode()
    out = _ours_greedy(HFDecoder(tiny_llama), prompts)
    _assert_greedy_equals_hf(out.responses, tiny_llama, prompts)
    assert (out.log_probs - _full_forward_log_probs(tiny_llama, prompts, out.responses)).abs().max() < 1e-5


def test_lean_bf16_logits_track_hf(tokenizer, encode):
    model = build_tiny_model(tokenizer, arch="llama", num_layers=2, seed=0, dtype=torch.bfloat16)
    prompts = encode()
    decoder = LeanDecoder(model, "packed")
    with torch.inference_mode():
        width = prompts["input_ids"].shape[1]
        ours = decoder.prefill(prompts["input_ids"], prompts["attention_mask"], prompts["position_ids"], width + 4)
        theirs = model(**prompts).logits[:, -1].float()
    assert (ours - theirs).abs().max().item() < 0.05 * theirs.abs().max().item()


def test_packed_weights_follow_in_place_updates(tiny_llama, encode):
    prompts = encode()
    decoder = LeanDecoder(tiny_llama, "packed")
    before = _ours_greedy(decoder, prompts).log_probs
    weight = tiny_llama.model.layers[0].mlp.down_proj.weight
    saved = weight.detach().clone()
    try:
        with torch.no_grad():
            weight.mul_(3.0)  # what an optimizer step does: in place, version counter bumps
        after = _ours_greedy(decoder, prompts)
        assert not torch.allclose(before, after.log_probs)
        reference = _full_forward_log_probs(tiny_llama, prompts, after.responses)
        assert (after.log_probs - reference).abs().max().item() < 1e-5
    finally:
        with torch.no_grad():
            weight.copy_(saved)


def test_unsupported_architectures_fall_back_to_hf_forward(encode):
    gpt2 = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=512, n_positions=64)).eval()
    assert "model_type 'gpt2'" in lean_unsupported_reason(gpt2)
    assert isinstance(build_decoder(gpt2, "auto"), HFDecoder)
    with pytest.raises(ValueError, match="cannot run this model: model_type 'gpt2'"):
        build_decoder(gpt2, "lean")
    prompts = encode()
    out = _ours_greedy(build_decoder(gpt2), prompts, steps=8)
    _assert_greedy_equals_hf(out.responses, gpt2, prompts, steps=8)


def _lora_model(tiny_llama, **lora_kwargs):
    from peft import LoraConfig, get_peft_model

    base = type(tiny_llama)(tiny_llama.config)
    base.load_state_dict(tiny_llama.state_dict())
    config = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"], **lora_kwargs)
    return get_peft_model(base, config).eval()


def test_lora_adapters_are_merged_into_packed_weights(tiny_llama, encode):
    model = _lora_model(tiny_llama, init_lora_weights=False)  # random B: adapters change outputs
    decoder = build_decoder(model)
    assert isinstance(decoder, LeanDecoder) and decoder.weight_format == "packed"
    prompts = encode()
    out = _ours_greedy(decoder, prompts, steps=8)
    _assert_greedy_equals_hf(out.responses, model, prompts, steps=8)
    assert (out.log_probs - _full_forward_log_probs(model, prompts, out.responses)).abs().max() < 1e-5
    lora_b = model.base_model.model.model.layers[0].self_attn.q_proj.lora_B["default"].weight
    with torch.no_grad():
        lora_b.mul_(4.0)  # an optimizer step on the adapter only
    updated = _ours_greedy(decoder, prompts, steps=8)
    assert (updated.log_probs - _full_forward_log_probs(model, prompts, updated.responses)).abs().max() < 1e-5
    with model.disable_adapter():  # the reference policy's view: base weights only
        base = _ours_greedy(decoder, prompts, steps=8)
        _assert_greedy_equals_hf(base.responses, tiny_llama, prompts, steps=8)


def test_lora_variants_fall_back_to_hf_forward(tiny_llama, encode):
    model = _lora_model(tiny_llama, init_lora_weights=False, use_dora=True)
    assert "LoRA variants" in lean_unsupported_reason(model)
    decoder = build_decoder(model)
    assert isinstance(decoder, HFDecoder)
    prompts = encode()
    out = _ours_greedy(decoder, prompts, steps=6)
    _assert_greedy_equals_hf(out.responses, model, prompts, steps=6)


def test_unknown_decoder_and_format_names_are_rejected(tiny_llama):
    with pytest.raises(ValueError, match="unknown decoder 'fast'; valid: auto, lean, hf"):
        build_decoder(tiny_llama, "fast")
    with pytest.raises(ValueError, match="unknown weight_format 'fused'"):
        LeanDecoder(tiny_llama, "fused")
