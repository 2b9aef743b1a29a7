"""The decode step's shortcuts (issue 35) compute what the plain formulas compute, bit for bit.

Greedy picking with one ``max`` pass, the log-prob from the row maxima already at hand, the
attention scores with an additive bias in the matmul, and RoPE with a sign-folded sine table
must each equal the longer form they replace, so the sampler's tokens and log-probs do not move.
"""

from __future__ import annotations

import pytest
import torch

from hybridflow.inference.lean_decoder import _additive_masks, _decode_attention, _rope
from hybridflow.inference.sampling import (
    GenerationParams,
    NonFiniteLogitsError,
    _draw,
    _log_probs_given_max,
    sample_next,
    token_log_probs,
)


def _logits(rows: int, vocab: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(rows, vocab, generator=generator) * 8
    logits[0, :5] = float("-inf")  # a legitimate mask beside finite entries
    logits[-1, 3] = logits[-1].max() + 1
    logits[-1, 9] = logits[-1, 3]  # a tie: the first index wins, as argmax
    return logits


@pytest.mark.parametrize("vocab", [11, 1000, 49153])
def test_greedy_tokens_and_log_probs_equal_argmax_and_logsumexp(vocab: int) -> None:
    logits = _logits(6, vocab)
    tokens, log_probs = sample_next(logits, GenerationParams(max_new_tokens=1, do_sample=False), None)
    assert torch.equal(tokens, logits.argmax(dim=-1))
    assert tokens[-1].item() == 3
    assert torch.equal(log_probs, token_log_probs(logits, tokens))


def test_log_probs_given_max_is_logsumexp_bit_for_bit() -> None:
    logits = _logits(32, 4096)
    tokens = torch.arange(32) * 7
    assert torch.equal(_log_probs_given_max(logits, tokens, logits.amax(dim=-1)), token_log_probs(logits, tokens))


def test_greedy_at_a_temperature_scores_at_that_temperature() -> None:
    logits = _logits(4, 300)
    tokens, log_probs = sample_next(logits, GenerationParams(max_new_tokens=1, do_sample=False, temperature=0.7), None)
    assert torch.equal(log_probs, token_log_probs(logits, tokens, 0.7))


def test_sampled_log_probs_equal_the_actor_formula_and_nan_rows_raise() -> None:
    logits = _logits(8, 2048)
    generator = torch.Generator().manual_seed(1)
    tokens, log_probs = sample_next(logits, GenerationParams(max_new_tokens=1), generator)
    assert torch.equal(log_probs, token_log_probs(logits, tokens))
    logits[2, 10] = float("nan")
    with pytest.raises(NonFiniteLogitsError, match="1 of 8 rows"):
        sample_next(logits, GenerationParams(max_new_tokens=1, do_sample=False), None)


@pytest.mark.parametrize("vocab", [4096, 4100])  # a multiple of the draw's block, and not
def test_draw_finds_the_one_token_with_mass(vocab: int) -> None:
    probs = torch.zeros(3, vocab)
    probs[0, 2000], probs[1, 0], probs[2, vocab - 1] = 1.0, 0.5, 2.0
    assert _draw(probs, torch.Generator().manual_seed(0)).tolist() == [2000, 0, vocab - 1]


def test_attention_with_additive_bias_equals_masked_scores() -> None:
    generator = torch.Generator().manual_seed(0)
    rows, kv, group, dim, max_len, length = 4, 3, 3, 64, 20, 13
    cache = torch.randn(2, rows, kv, max_len, dim, generator=generator)
    keys, values = cache[0][:, :, :length], cache[1][:, :, :length]  # strided views, as in decode
    q = torch.randn(rows, kv, group, dim, generator=generator)
    valid = torch.ones(rows, 1, 1, length, dtype=torch.bool)
    valid[1, ..., :4] = False
    bias = _additive_masks({None: valid}, kv)[None]
    scores = torch.matmul(q, keys.transpose(-1, -2)).mul_(dim**-0.5).masked_fill_(~valid, float("-inf"))
    expected = torch.matmul(torch.softmax(scores, dim=-1), values)
    assert torch.equal(_decode_attention(q, keys, values, bias, None), expected)
    unmasked = torch.matmul(torch.softmax(torch.matmul(q, keys.transpose(-1, -2)).mul_(0.1), dim=-1), values)
    assert torch.equal(_decode_attention(q, keys, values, None, 0.1), unmasked)


def test_rope_with_folded_sine_equals_rotate_half() -> None:
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(5, 12, 64, generator=generator)
    angles = torch.rand(5, 1, 32, generator=generator) * 6
    cos, sin = torch.cat([angles.cos()] * 2, dim=-1), torch.cat([angles.sin()] * 2, dim=-1)
    rotate_half = torch.cat((-x[..., 32:], x[..., :32]), dim=-1)
    folded = torch.cat((-sin[..., :32], sin[..., 32:]), dim=-1)
    assert torch.equal(_rope(x, cos, folded), x * cos + rotate_half * sin)
