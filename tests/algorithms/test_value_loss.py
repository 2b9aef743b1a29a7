"""Clipped value loss by hand."""

import pytest
import torch

from hybridflow.algorithms.aggregation import GlobalBatchInfo
from hybridflow.algorithms.value_loss import compute_value_loss


def test_clipped_value_loss_by_hand():
    vpreds = torch.tensor([[1.0, 2.5]], requires_grad=True)
    values = torch.tensor([[0.5, 2.0]])
    returns = torch.tensor([[0.0, 3.0]])
    # token 0: v_c = clip(1.0, 0.3, 0.7) = 0.7; (1 − 0)² = 1 > 0.49 → 1, not clipped
    # token 1: v_c = clip(2.5, 1.8, 2.2) = 2.2; (2.5 − 3)² = 0.25 < 0.64 → 0.64, clipped
    loss, clipfrac = compute_value_loss(vpreds, returns, values, torch.ones(1, 2), cliprange_value=0.2)
    assert loss.item() == pytest.approx(0.5 * (1 + 0.64) / 2)
    assert clipfrac.item() == pytest.approx(0.5)
    assert not clipfrac.requires_grad
    loss.backward()
    # token 0: ½·2(v̂ − R)/2 = 0.5; token 1 uses the clipped branch, constant in v̂ → 0
    assert vpreds.grad[0].tolist() == pytest.approx([0.5, 0.0])


def test_value_loss_modes_and_global_info():
    vpreds = torch.tensor([[1.0, 2.0, 0.0]])
    values = vpreds.clone()
    returns = torch.tensor([[0.0, 0.0, 5.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    # losses 1, 4 on valid tokens
    loss, _ = compute_value_loss(vpreds, returns, values, mask, 0.5, "seq-mean-token-sum")
    assert loss.item() == pytest.approx(2.5)
    loss, _ = compute_value_loss(
        vpreds, returns, values, mask, 0.5, "token-mean", global_batch_info=GlobalBatchInfo(batch_num_tokens=10)
    )
    assert loss.item() == pytest.approx(0.25)


def test_negative_cliprange_rejected():
    x = torch.zeros(1, 1)
    with pytest.raises(ValueError, match="cliprange_value"):
        compute_value_loss(x, x, x, torch.ones(1, 1), cliprange_value=-0.1)
