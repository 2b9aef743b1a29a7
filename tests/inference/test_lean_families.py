"""The sampler's fast path on five model families (issue 31): llama, qwen2, mistral, qwen3, gemma3.

Each tiny random model (fp32) runs through ``build_decoder(model)`` — the lean decoder for all
five — and must give HF ``generate``'s greedy tokens and the actor's log-probs
(``engine.forward.response_log_probs`` on the collated rows) within the single-turn limits of
``tests/rollout/test_real_model.py``: max ≤ 3e-5, mean ≤ 6e-6. Prompt + response (up to 26
tokens) is longer than the tiny Gemma 3's sliding window (8), so its local layers cut keys
off in prefill and in decode; a test checks that the window changes the outputs.
"""

from __future__ import annotations

import logging

import pytest
import torch
from tensordict import TensorDict

from hybridflow.engine.forward import response_log_probs
from hybridflow.inference.batcher_types import GenRequest
from hybridflow.inference.continuous import ContinuousBatcher
from hybridflow.inference.decoders import build_decoder
from hybridflow.inference.generation import Generated, generate
from hybridflow.inference.hf_decoder import HFDecoder
from hybridflow.inference.lean_decoder import LeanDecoder, lean_unsupported_reason
from hybridflow.inference.sampling import GenerationParams
from hybridflow.models.tiny import TINY_GEMMA3_SLIDING_WINDOW, build_tiny_model, build_tiny_tokenizer
from tests.numerics import TINY_DEPTH, TINY_WIDTH, assert_greedy_tokens_match

pytestmark = pytest.mark.usefixtures("one_torch_thread")

FAMILIES = ("llama", "qwen2", "mistral", "qwen3", "gemma3")
MAX_DIFF, MEAN_DIFF = 3e-5, 6e-6  # the single-turn limits (fp32)
STEPS = 16
PAD = 3
PROMPTS = ("What is 7 + 5?", "Hi", "The quick brown fox jumps over", "Compute 123 * 4 = 492, then")
# ≥ 8 tokens shared by every prompt: the lean decoder's shared-prefix prefill (packed weights)
SYSTEM = "You are a helpful assistant. Please answer the question step by step. "


@pytest.fixture(scope="module")
def tokenizer():
    tok = build_tiny_tokenizer()
    tok.padding_side = "left"
    return tok


@pytest.fixture(scope="module")
def models(tokenizer):
    return {arch: build_tiny_model(tokenizer, arch=arch, seed=0) for arch in FAMILIES}


def _prompts(tokenizer, texts=PROMPTS) -> dict[str, torch.Tensor]:
    enc = tokenizer(list(texts), return_tensors="pt", padding=True)
    mask = enc["attention_mask"]
    assert len(set(mask.sum(1).tolist())) > 1  # the batch is padded
    return {"input_ids": enc["input_ids"], "attention_mask": mask, "position_ids": (mask.cumsum(-1) - 1).clamp(min=0)}


def _greedy(decoder, prompts) -> Generated:
    params = GenerationParams(max_new_tokens=STEPS, do_sample=False)
    return generate(decoder, prompts["input_ids"], prompts["attention_mask"], prompts["position_ids"], params, PAD)


def _rows(prompts, responses) -> TensorDict:
    """The rollout rows the actor sees: [prompt (left-padded) | response]."""
    mask = torch.cat([prompts["attention_mask"], torch.ones_like(responses)], dim=1)
    return TensorDict(
        {
            "input_ids": torch.cat([prompts["input_ids"], responses], dim=1),
            "attention_mask": mask,
            "position_ids": (mask.cumsum(-1) - 1).clamp(min=0),
            "responses": responses,
        },
        batch_size=[responses.shape[0]],
    )


def _actor_log_probs(model, prompts, responses) -> torch.Tensor:
    with torch.no_grad():
        return response_log_probs(model, _rows(prompts, responses))["log_probs"]


def _assert_matches_hf_and_actor(model, prompts, out: Generated) -> None:
    with torch.inference_mode():
        hf = model.generate(
            input_ids=prompts["input_ids"],
            attention_mask=prompts["attention_mask"],
            max_new_tokens=STEPS,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=PAD,
            output_logits=True,
            return_dict_in_generate=True,
        )
    tokens = hf.sequences[:, prompts["input_ids"].shape[1] :]
    assert_greedy_tokens_match(
        out.responses,
        tokens,
        torch.stack(hf.logits, dim=1),
        dtype=torch.float32,
        reduction_size=TINY_WIDTH,
        depth=TINY_DEPTH,
        what="greedy tokens vs HF generate",
    )
    diff = (out.log_probs - _actor_log_probs(model, prompts, out.responses)).abs()
    assert diff.max().item() <= MAX_DIFF and diff.mean().item() <= MEAN_DIFF, (diff.max().item(), diff.mean().item())


@pytest.mark.parametrize("arch", FAMILIES)
@pytest.mark.parametrize("weight_format", ["shared", "packed"])
def test_lean_greedy_equals_hf_generate_and_log_probs_match_the_actor(models, tokenizer, arch, weight_format):
    model = models[arch]
    decoder = build_decoder(model, "auto", weight_format)
    assert isinstance(decoder, LeanDecoder)  # every family is on the fast path
    _assert_matches_hf_and_actor(model, _prompts(tokenizer), _greedy(decoder, _prompts(tokenizer)))


@pytest.mark.parametrize("arch", ["qwen3", "gemma3"])
def test_shared_prefix_prefill_matches_the_actor(models, tokenizer, arch):
    # packed weights run a prefix common to all rows once; the windowed layers must still
    # measure distances in positions, not cache columns
    prompts = _prompts(tokenizer, [SYSTEM + text for text in PROMPTS])
    assert prompts["input_ids"].shape[1] + STEPS > 2 * TINY_GEMMA3_SLIDING_WINDOW
    out = _greedy(LeanDecoder(models[arch], "packed"), prompts)
    _assert_matches_hf_and_actor(models[arch], prompts, out)


@pytest.mark.parametrize("arch", ["qwen3", "gemma3"])
def test_continuous_batching_joins_equal_each_request_alone(models, tokenizer, arch):
    """Requests joining a running batch (re-prefilled with the rows already there, their caches
    compacted) decode what each decodes alone, past the sliding window."""
    decoder = build_decoder(models[arch], "auto", "packed")
    params = GenerationParams(max_new_tokens=STEPS, do_sample=False)
    prompts = [tuple(tokenizer(text)["input_ids"]) for text in PROMPTS[:3]]
    batcher = ContinuousBatcher(decoder, PAD)
    arrivals = {0: prompts[0], 2: prompts[1], 5: prompts[2]}
    handles, results = [], {}
    for step in range(3 * STEPS):
        if step in arrivals:
            handles.append(batcher.submit(GenRequest(arrivals[step], params)))
        results.update(dict(batcher.step()))
        if batcher.idle and step > max(arrivals):
            break
    assert batcher.stats.joins == 2
    for handle, prompt in zip(handles, prompts, strict=True):
        ids = torch.tensor([prompt])
        mask = torch.ones_like(ids)
        alone = generate(decoder, ids, mask, mask.cumsum(1) - 1, params, PAD)
        (joined,) = results[handle]
        assert joined.token_ids == alone.responses[0].tolist()
        torch.testing.assert_close(torch.tensor(joined.logprobs), alone.log_probs[0], atol=MAX_DIFF, rtol=0)


@pytest.mark.parametrize("arch", ["qwen3", "gemma3"])
def test_sampled_fan_out_log_probs_match_the_actor(models, tokenizer, arch):
    """n = 2 samples per prompt at temperature 1: the cache rows (keys, validity, positions) are
    repeated per sample and each sample's log-probs are the actor's."""
    prompts = _prompts(tokenizer)
    params = GenerationParams(max_new_tokens=STEPS, do_sample=True, temperature=1.0, n=2)
    out = generate(
        build_decoder(models[arch]),
        prompts["input_ids"],
        prompts["attention_mask"],
        prompts["position_ids"],
        params,
        PAD,
        torch.Generator().manual_seed(0),
    )
    repeated = {key: value.repeat_interleave(2, dim=0) for key, value in prompts.items()}
    diff = (out.log_probs - _actor_log_probs(models[arch], repeated, out.responses)).abs()
    assert diff.max().item() <= MAX_DIFF and diff.mean().item() <= MEAN_DIFF, (diff.max().item(), diff.mean().item())


def test_gemma3_sliding_window_changes_the_outputs(models, tokenizer):
    """The parity above is only evidence if the window cuts keys off in these sequences."""
    gemma = models["gemma3"]
    assert gemma.config.layer_types == ["sliding_attention", "full_attention"]
    prompts = _prompts(tokenizer)
    out = _greedy(LeanDecoder(gemma), prompts)
    config = type(gemma.config)(**{**gemma.config.to_dict(), "sliding_window": 4096})
    unwindowed = type(gemma)(config).eval()
    unwindowed.load_state_dict(gemma.state_dict())
    windowed = _actor_log_probs(gemma, prompts, out.responses)
    assert (windowed - _actor_log_probs(unwindowed, prompts, out.responses)).abs().max().item() > 1e-2


def test_gemma3_final_logit_softcapping_is_applied(tokenizer):
    gemma = build_tiny_model(tokenizer, arch="gemma3", seed=1)
    gemma.config.final_logit_softcapping = 0.5  # small: it changes the tiny model's logits a lot
    prompts = _prompts(tokenizer)
    out = _greedy(LeanDecoder(gemma), prompts)
    _assert_matches_hf_and_actor(gemma, prompts, out)
    gemma.config.final_logit_softcapping = None  # the cap matters: without it the log-probs move
    assert (out.log_probs - _actor_log_probs(gemma, prompts, out.responses)).abs().max().item() > 1e-2


def test_uncovered_gemma3_features_fall_back_to_hf_with_one_log_line(tokenizer, caplog):
    gemma = build_tiny_model(tokenizer, arch="gemma3", seed=0)
    gemma.config.attn_logit_softcapping = 50.0
    assert lean_unsupported_reason(gemma) == "lean does not support gemma3 attention softcapping"
    with caplog.at_level(logging.INFO, logger="hybridflow.inference.decoders"):
        decoder = build_decoder(gemma)
    assert isinstance(decoder, HFDecoder)
    assert [r.getMessage() for r in caplog.records] == [
        "decoder: hf (lean does not support gemma3 attention softcapping)"
    ]
    with pytest.raises(ValueError, match="gemma3 attention softcapping"):
        build_decoder(gemma, "lean")
    gemma.config.attn_logit_softcapping = None
    gemma.config.use_bidirectional_attention = True
    assert lean_unsupported_reason(gemma) == "lean does not support gemma3 bidirectional attention"
    gemma.config.use_bidirectional_attention = False
    gemma.config.hidden_activation = "gelu"
    assert "activation 'gelu' of gemma3_text" in (lean_unsupported_reason(gemma) or "")


def test_lean_path_says_nothing(models, caplog):
    with caplog.at_level(logging.INFO, logger="hybridflow.inference.decoders"):
        assert isinstance(build_decoder(models["gemma3"]), LeanDecoder)
    assert caplog.records == []
