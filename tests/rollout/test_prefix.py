"""The shared prompt prefix: finding it, and generating through it exactly as without it."""

from __future__ import annotations

import pytest
import torch

from hybridflow.inference.generation import generate
from hybridflow.inference.lean_decoder import LeanDecoder
from hybridflow.inference.prefix import shared_prefix_length
from hybridflow.inference.sampling import GenerationParams
from tests.numerics import TINY_DEPTH, TINY_WIDTH, assert_greedy_tokens_match


def _left_pad(rows: list[list[int]], pad: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    width = max(map(len, rows))
    ids = torch.tensor([[pad] * (width - len(r)) + r for r in rows])
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
    return ids, mask, (mask.cumsum(-1) - 1).clamp(min=0)


@pytest.mark.parametrize(
    "rows, expected",
    [
        ([[5, 6, 7, 8], [5, 6, 7, 9, 9, 9]], 3),  # differ at the 4th token
        ([[5, 6, 7, 8], [5, 6, 7, 8, 1, 2]], 3),  # one row is a prefix of the other: keep 1 own token
        ([[5, 6], [7, 6]], 0),  # differ at once
        ([[5, 6, 7]], 0),  # a single row shares nothing
        ([[5], [5, 6]], 0),  # shortest prompt has one token
    ],
)
def test_shared_prefix_length(rows, expected):
    assert shared_prefix_length(*_left_pad(rows)) == expected


def test_shared_prefix_requires_positions_from_zero():
    ids, mask, pos = _left_pad([[5, 6, 7, 8], [5, 6, 7, 9]])
    assert shared_prefix_length(ids, mask, pos + 1) == 0


@pytest.mark.parametrize("arch", ["tiny_llama", "tiny_qwen2"])
def test_generation_through_a_shared_prefix_matches_hf(request, tokenizer, arch):
    model = request.getfixturevalue(arch)
    system = "You are a helpful assistant. Please answer the question step by step."
    texts = [
        tokenizer.apply_chat_template(
            [{"role": "system", "content": system}, {"role": "user", "content": q}],
            tokenize=False, add_generation_prompt=True,
        )
        for q in ("What is 7 + 5?", "Hi", "The quick brown fox jumps over the lazy dog.")
    ]
    enc = tokenizer(texts, return_tensors="pt", padding=True)
    mask = enc["attention_mask"]
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    prefix = shared_prefix_length(enc["input_ids"], mask, pos)
    assert prefix >= 8
    decoder = LeanDecoder(model, "packed")
    params = GenerationParams(max_new_tokens=12, do_sample=False)
    out = generate(decoder, enc["input_ids"], mask, pos, params, pad_token_id=3)
    width = int(mask.sum(1).max()) - prefix
    assert decoder.cache.length == prefix + width + 11  # the prefix was stored once per row, not padded
    with torch.inference_mode():
        hf = model.generate(**enc, max_new_tokens=12, do_sample=False, eos_token_id=None, pad_token_id=3,
                            output_logits=True, return_dict_in_generate=True)
    # another backend: equal greedy tokens up to a near tie of HF's logits (tests/numerics.py)
    assert_greedy_tokens_match(out.responses, hf.sequences[:, mask.shape[1] :], torch.stack(hf.logits, dim=1),
                               dtype=torch.float32, reduction_size=TINY_WIDTH, depth=TINY_DEPTH,
                               what="greedy tokens vs HF generate")
    full_mask = torch.cat([mask, torch.ones_like(out.responses)], 1)
    with torch.no_grad():
        logits = model(
            input_ids=torch.cat([enc["input_ids"], out.responses], 1), attention_mask=full_mask,
            position_ids=(full_mask.cumsum(-1) - 1).clamp(min=0),
        ).logits
    plen = mask.shape[1]
    reference = torch.log_softmax(logits[:, plen - 1 : -1], -1).gather(-1, out.responses[..., None])[..., 0]
    assert (out.log_probs - reference).abs().max().item() < 1e-5
