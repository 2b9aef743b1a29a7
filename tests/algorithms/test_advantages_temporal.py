"""GAE, REINFORCE++ and ReMax against hand-computed numbers."""

import math

import pytest
import torch

from hybridflow.algorithms.advantages import (
    compute_gae_advantage_return,
    compute_reinforce_plus_plus_outcome_advantage,
    compute_remax_outcome_advantage,
)

REWARDS = torch.tensor([[0.0, 0.0, 1.0]])
VALUES = torch.tensor([[1.0, 2.0, 3.0]])
FULL = torch.ones(1, 3)


def test_gae_gamma_lambda_one_by_hand():
    # t2: δ = 1 − 3 = −2; t1: δ = 0 + 3 − 2 = 1, Â = −1; t0: δ = 0 + 2 − 1 = 1, Â = 0
    adv, ret = compute_gae_advantage_return(REWARDS, VALUES, FULL, gamma=1.0, lam=1.0)
    assert ret.tolist() == [[1.0, 1.0, 1.0]]
    # Â = [0, −1, −2] whitened: mean −1, unbiased var 1
    assert adv[0].tolist() == pytest.approx([1.0, 0.0, -1.0], abs=1e-6)


def test_gae_discounted_by_hand():
    # γ = λ = 0.5: Â2 = −2; δ1 = 1.5 − 2 = −0.5, Â1 = −0.5 − 0.5 = −1; δ0 = 1 − 1 = 0, Â0 = −0.25
    adv, ret = compute_gae_advantage_return(REWARDS, VALUES, FULL, gamma=0.5, lam=0.5)
    assert ret[0].tolist() == pytest.approx([0.75, 1.0, 1.0])
    raw = torch.tensor([-0.25, -1.0, -2.0])
    expected = (raw - raw.mean()) / raw.std()
    assert adv[0].tolist() == pytest.approx(expected.tolist(), abs=1e-5)


def test_gae_skips_masked_positions_and_ignores_their_values():
    mask = torch.tensor([[1.0, 0.0, 1.0]])  # t1 is a tool-output token
    _, ret = compute_gae_advantage_return(REWARDS, VALUES, mask, gamma=1.0, lam=1.0)
    # t2: Â = −2 (V_next ← 3); t1 skipped; t0: δ = 0 + 3 − 1 = 2, Â = 2 − 2 = 0 → return 1
    assert ret[0, 0].item() == pytest.approx(1.0) and ret[0, 2].item() == pytest.approx(1.0)
    other_values = VALUES.clone()
    other_values[0, 1] = 123.0
    adv_a, ret_a = compute_gae_advantage_return(REWARDS, VALUES, mask, gamma=0.9, lam=0.8)
    adv_b, ret_b = compute_gae_advantage_return(REWARDS, other_values, mask, gamma=0.9, lam=0.8)
    assert torch.equal(adv_a, adv_b)
    assert torch.equal(ret_a[mask.bool()], ret_b[mask.bool()])
    assert adv_a[0, 1].item() == 0.0


def test_reinforce_plus_plus_by_hand():
    rewards = torch.tensor([[0.0, 0.0, 1.0], [0.0, 0.0, 0.0]])
    mask = torch.ones(2, 3)
    adv, ret = compute_reinforce_plus_plus_outcome_advantage(rewards, mask, gamma=1.0)
    assert ret.tolist() == [[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]]
    # six tokens 1,1,1,0,0,0: mean 0.5, unbiased var 0.3 → ±0.5/√0.3 = ±0.912871
    assert adv[0].tolist() == pytest.approx([0.5 / math.sqrt(0.3)] * 3, rel=1e-5)
    assert adv[1].tolist() == pytest.approx([-0.5 / math.sqrt(0.3)] * 3, rel=1e-5)
    _, ret = compute_reinforce_plus_plus_outcome_advantage(rewards, mask, gamma=0.5)
    assert ret[0].tolist() == pytest.approx([0.25, 0.5, 1.0])


def test_reinforce_plus_plus_does_not_carry_across_the_mask():
    rewards = torch.tensor([[0.0, 1.0, 5.0], [1.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    adv, ret = compute_reinforce_plus_plus_outcome_advantage(rewards, mask, gamma=0.5)
    assert ret[0].tolist() == pytest.approx([0.5, 1.0, 5.0])  # the 5 after EOS never flows back
    assert adv[0, 2].item() == 0.0


def test_remax_by_hand():
    adv, ret = compute_remax_outcome_advantage(REWARDS, torch.tensor([0.25]), FULL)
    assert ret.tolist() == [[1.0, 1.0, 1.0]]
    assert adv[0].tolist() == pytest.approx([0.75, 0.75, 0.75])
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    adv, ret = compute_remax_outcome_advantage(torch.tensor([[0.0, 1.0, 7.0]]), torch.tensor([0.25]), mask)
    assert ret[0].tolist() == [1.0, 1.0, 0.0]
    assert adv[0].tolist() == pytest.approx([0.75, 0.75, 0.0])
