"""The fused token log-prob / entropy kernel against the stock formulas and by hand."""

from __future__ import annotations

import math

import pytest
import torch

from hybridflow.algorithms.utils import entropy_from_logits, logprobs_from_logits
from hybridflow.engine import fused_log_probs
from hybridflow.engine.fused_log_probs import token_log_probs


def test_hand_computed_value_and_gradient() -> None:
    # softmax([0, ln 3]) = [1/4, 3/4]; label 1 → log 3/4; ∂ℓ/∂z = onehot − p = [−1/4, 1/4]
    logits = torch.tensor([[0.0, math.log(3.0)]], requires_grad=True)
    log_probs, entropy = token_log_probs(logits, torch.tensor([1]), with_entropy=True)
    assert log_probs.item() == pytest.approx(math.log(0.75), abs=1e-7)
    assert entropy.item() == pytest.approx(-(0.25 * math.log(0.25) + 0.75 * math.log(0.75)), abs=1e-6)
    log_probs.sum().backward()
    torch.testing.assert_close(logits.grad, torch.tensor([[-0.25, 0.25]]), atol=1e-7, rtol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_matches_the_stock_formulas(dtype: torch.dtype, temperature: float, monkeypatch) -> None:
    monkeypatch.setattr(fused_log_probs, "CHUNK_ROWS", 5)  # several chunks, one partial
    g = torch.Generator().manual_seed(0)
    logits = (3 * torch.randn(3, 4, 50, generator=g)).to(dtype)
    labels = torch.randint(0, 50, (3, 4), generator=g)
    upstream = torch.randn(3, 4, generator=g)

    fused_in = logits.clone().requires_grad_(True)
    log_probs, entropy = token_log_probs(fused_in, labels, temperature, with_entropy=True)
    (log_probs * upstream).sum().backward()

    stock_in = logits.clone().requires_grad_(True)
    stock = logprobs_from_logits(stock_in.float(), labels, temperature)
    (stock * upstream).sum().backward()

    assert torch.equal(log_probs, stock)  # bit for bit: the sampler's log-probs rely on it
    torch.testing.assert_close(entropy, entropy_from_logits(logits.float(), temperature), atol=1e-5, rtol=1e-5)
    assert fused_in.grad.dtype == dtype
    tolerance = 1e-6 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(fused_in.grad.float(), stock_in.grad.float(), atol=tolerance, rtol=tolerance)
    assert not entropy.requires_grad


def test_backward_leaves_float32_logits_untouched() -> None:
    logits = torch.randn(4, 9, requires_grad=True)
    before = logits.detach().clone()
    log_probs, _ = token_log_probs(logits, torch.tensor([0, 3, 8, 2]))
    log_probs.sum().backward()
    assert torch.equal(logits.detach(), before)


def test_gradient_rows_sum_to_zero() -> None:
    # Σ_v (1[v = y] − p_v) = 0 for every row: shifting all logits of a row changes no log-prob
    logits = torch.randn(6, 11, requires_grad=True)
    log_probs, _ = token_log_probs(logits, torch.randint(0, 11, (6,)), temperature=1.3)
    log_probs.sum().backward()
    torch.testing.assert_close(logits.grad.sum(-1), torch.zeros(6), atol=1e-6, rtol=0)


def test_bad_inputs() -> None:
    with pytest.raises(ValueError, match="temperature must be > 0"):
        token_log_probs(torch.zeros(2, 3), torch.zeros(2, dtype=torch.long), temperature=0.0)
    with pytest.raises(ValueError, match=r"logits \(2, 3\) and labels \(3,\) disagree"):
        token_log_probs(torch.zeros(2, 3), torch.zeros(3, dtype=torch.long))
