"""Token choice: greedy, temperature, top-k, top-p, and the log-probs returned with it."""

from __future__ import annotations

import math

import pytest
import torch

from hybridflow.inference.sampling import GenerationParams, sample_next, token_log_probs


def _draw(logits: torch.Tensor, params: GenerationParams, rows: int = 20000, seed: int = 0) -> torch.Tensor:
    """Empirical token frequencies over ``rows`` draws (in chunks of 2000 rows to bound memory)."""
    gen = torch.Generator().manual_seed(seed)
    counts = torch.zeros(logits.shape[-1], dtype=torch.float64)
    for start in range(0, rows, 2000):
        chunk = logits.expand(min(2000, rows - start), -1).contiguous()
        tokens, _ = sample_next(chunk, params, gen)
        counts += torch.bincount(tokens, minlength=logits.shape[-1]).double()
    return counts / rows


def test_token_log_probs_hand_computed():
    logits = torch.tensor([[0.0, math.log(3.0)], [math.log(2.0), 0.0]])
    got = token_log_probs(logits, torch.tensor([1, 1]))
    assert torch.allclose(got, torch.tensor([math.log(0.75), math.log(1 / 3)]), atol=1e-6)
    # temperature 2 halves the logits: probs ∝ (1, √3)
    got_t = token_log_probs(logits[:1], torch.tensor([0]), temperature=2.0)
    assert got_t.item() == pytest.approx(math.log(1 / (1 + math.sqrt(3.0))), abs=1e-6)


def test_greedy_returns_argmax_scored_as_the_actor_scores():
    logits = torch.tensor([[1.0, 3.0, 2.0], [0.5, 0.1, 0.2]])
    # do_sample=False with temperature 0.7: the actor scores at τ = 0.7, so does the rollout
    tokens, log_probs = sample_next(logits, GenerationParams(max_new_tokens=1, temperature=0.7, do_sample=False), None)
    assert tokens.tolist() == [1, 0]
    assert torch.allclose(log_probs, torch.log_softmax(logits / 0.7, -1)[[0, 1], [1, 0]])
    # temperature 0 means greedy, scored at τ = 1
    tokens, log_probs = sample_next(logits, GenerationParams(max_new_tokens=1, temperature=0.0), None)
    assert tokens.tolist() == [1, 0]
    assert torch.allclose(log_probs, torch.log_softmax(logits, -1)[[0, 1], [1, 0]])


def test_temperature_sampling_frequencies():
    logits = torch.tensor([[0.0, math.log(3.0), math.log(6.0)]])
    freq = _draw(logits, GenerationParams(max_new_tokens=1, temperature=1.0))
    assert torch.allclose(freq, torch.tensor([0.1, 0.3, 0.6], dtype=torch.float64), atol=0.015)
    # T = 2: probs ∝ sqrt(1, 3, 6)
    expected = torch.tensor([1.0, 3.0, 6.0]).sqrt()
    freq_t = _draw(logits, GenerationParams(max_new_tokens=1, temperature=2.0))
    assert torch.allclose(freq_t, (expected / expected.sum()).double(), atol=0.015)


def test_sampled_log_prob_is_full_vocab_tempered():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]])
    params = GenerationParams(max_new_tokens=1, temperature=0.5, top_k=2)
    tokens, log_probs = sample_next(logits.expand(50, -1).contiguous(), params, torch.Generator().manual_seed(1))
    reference = torch.log_softmax(logits / 0.5, -1)[0]
    assert torch.allclose(log_probs, reference[tokens])


def test_top_k_keeps_k_and_renormalises():
    logits = torch.tensor([[3.0, 2.0, 1.0, 0.0]])
    freq = _draw(logits, GenerationParams(max_new_tokens=1, top_k=2))
    p0 = math.e / (math.e + 1)
    assert freq[2] == 0 and freq[3] == 0
    assert freq[0].item() == pytest.approx(p0, abs=0.015)


def test_top_p_keeps_smallest_set_reaching_mass():
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    params = GenerationParams(max_new_tokens=1, top_p=0.8)
    freq = _draw(probs.log(), params)
    # 0.5 < 0.8 so token 1 is kept; 0.5 + 0.3 reaches 0.8 so tokens 2, 3 are dropped.
    assert freq[2] == 0 and freq[3] == 0
    assert freq[0].item() == pytest.approx(0.625, abs=0.015)
    # top_p below the first probability keeps only the first token.
    assert _draw(probs.log(), GenerationParams(max_new_tokens=1, top_p=0.3))[0].item() == 1.0


def test_top_p_after_top_k_uses_renormalised_mass():
    probs = torch.tensor([[0.4, 0.3, 0.2, 0.1]])
    # top-k=2 renormalises to (4/7, 3/7); top_p=0.5 then keeps only token 0.
    freq = _draw(probs.log(), GenerationParams(max_new_tokens=1, top_k=2, top_p=0.5), rows=2000)
    assert freq[0].item() == 1.0


def test_top_p_over_large_flat_vocab_falls_back_to_full_sort():
    vocab = 3000  # more than the 1024 first-look candidates
    logits = torch.zeros(1, vocab)
    tokens, _ = sample_next(
        logits.expand(4000, -1).contiguous(), GenerationParams(max_new_tokens=1, top_p=0.5), torch.Generator().manual_seed(0)
    )
    # A flat distribution keeps 1500 tokens (mass before token i is i/3000 < 0.5).
    assert tokens.unique().numel() > 1024
    assert int(tokens.max()) < vocab


def test_sampling_is_seeded():
    logits = torch.randn(1, 50)
    params = GenerationParams(max_new_tokens=1, top_p=0.9)
    a = sample_next(logits.expand(64, -1).contiguous(), params, torch.Generator().manual_seed(3))[0]
    b = sample_next(logits.expand(64, -1).contiguous(), params, torch.Generator().manual_seed(3))[0]
    c = sample_next(logits.expand(64, -1).contiguous(), params, torch.Generator().manual_seed(4))[0]
    assert torch.equal(a, b) and not torch.equal(a, c)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"max_new_tokens": 0}, "max_new_tokens"),
        ({"max_new_tokens": 4, "temperature": -1.0}, "temperature"),
        ({"max_new_tokens": 4, "top_p": 0.0}, "top_p"),
        ({"max_new_tokens": 4, "n": 0}, "n must be"),
    ],
)
def test_bad_sampling_params_are_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        GenerationParams(**kwargs)


def test_large_vocab_draw_is_exact_across_blocks():
    # 3000 entries use the two-level (block, then entry) draw; mass sits in the first block,
    # a middle block and the padded last block, everything else has probability 0.
    probs = torch.zeros(1, 3000)
    probs[0, 5], probs[0, 700], probs[0, 2999] = 0.2, 0.3, 0.5
    freq = _draw(probs.log(), GenerationParams(max_new_tokens=1), rows=10000)
    assert set(torch.nonzero(freq)[:, 0].tolist()) == {5, 700, 2999}
    assert torch.allclose(freq[[5, 700, 2999]], torch.tensor([0.2, 0.3, 0.5], dtype=torch.float64), atol=0.02)


def test_large_vocab_draw_matches_a_spread_distribution():
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(1, 3000, generator=gen) * 2.0
    probs = torch.softmax(logits, -1)[0].double()
    freq = _draw(logits, GenerationParams(max_new_tokens=1), rows=20000)
    tolerance = 4.5 * (probs * (1 - probs) / 20000).sqrt() + 2e-4
    assert ((freq - probs).abs() <= tolerance).all()
    # block-level mass (512 tokens per block) is right too
    assert torch.allclose(freq[:2560].view(5, 512).sum(-1), probs[:2560].view(5, 512).sum(-1), atol=0.01)
