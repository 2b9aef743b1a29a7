"""Optimal Token Baseline (single- and multi-turn) by hand and by property."""

import math

import pytest
import torch

from hybridflow.algorithms.advantages import (
    compute_multi_turn_optimal_token_baseline_advantage,
    compute_optimal_token_baseline_advantage,
)

HALF, QUARTER = math.log(0.5), math.log(0.25)


def test_otb_by_hand():
    rewards = torch.tensor([[0.0, 1.0], [0.0, 0.0]])  # G = [1, 1] and [0, 0]
    mask = torch.ones(2, 2)
    old = torch.tensor([[HALF, HALF], [QUARTER, QUARTER]])
    spp = torch.full((2, 2), 0.5)
    # w = 1 − 2π + Σπ²: row 0 → 0.5 per token (W = 0.5, 1), row 1 → 1.0 (W = 1, 2)
    # B_0 = (1·0.5)/(0.5 + 1) = 1/3, B_1 = (1·1)/(1 + 2) = 1/3
    adv, ret = compute_optimal_token_baseline_advantage(rewards, mask, ["g", "g"], old, spp)
    assert ret.tolist() == [[1.0, 1.0], [0.0, 0.0]]
    assert adv[0].tolist() == pytest.approx([2 / 3, 2 / 3], rel=1e-6)
    assert adv[1].tolist() == pytest.approx([-1 / 3, -1 / 3], rel=1e-6)


def test_otb_importance_weights_scale_w_by_their_square():
    rewards = torch.tensor([[0.0, 1.0], [0.0, 0.0]])
    mask = torch.ones(2, 2)
    old = torch.full((2, 2), HALF)
    spp = torch.full((2, 2), 0.5)  # w = 0.5 everywhere
    weights = torch.tensor([[1.0, 1.0], [2.0, 2.0]])  # row 1's w becomes 2.0 (W = 2, 4)
    adv, _ = compute_optimal_token_baseline_advantage(rewards, mask, ["g", "g"], old, spp, weights)
    # B_0 = 0.5/(0.5 + 2) = 0.2, B_1 = 1/(1 + 4) = 0.2
    assert adv[0].tolist() == pytest.approx([0.8, 0.8], rel=1e-6)


def test_otb_zero_tail_for_the_single_longest_row():
    rewards = torch.tensor([[0.0, 1.0], [0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    old = torch.tensor([[HALF, HALF], [QUARTER, QUARTER]])
    spp = torch.full((2, 2), 0.5)
    without, _ = compute_optimal_token_baseline_advantage(
        rewards, mask, ["g", "g"], old, spp, handle_zero_tail=False
    )
    # position 1: only row 0 is valid, so its baseline is its own return → A = 0
    assert without[0, 1].item() == pytest.approx(0.0, abs=1e-6)
    with_tail, _ = compute_optimal_token_baseline_advantage(rewards, mask, ["g", "g"], old, spp)
    assert with_tail[0, 1].item() == pytest.approx(1.0)
    assert with_tail[0, 0].item() == pytest.approx(2 / 3, rel=1e-6)
    assert with_tail[1, 1].item() == 0.0


def test_otb_group_of_one_keeps_the_return():
    rewards = torch.tensor([[0.0, 2.0]])
    adv, ret = compute_optimal_token_baseline_advantage(
        rewards, torch.ones(1, 2), ["alone"], torch.zeros(1, 2), torch.ones(1, 2)
    )
    assert torch.equal(adv, ret)


def _random_case(seed, holes):
    g = torch.Generator().manual_seed(seed)
    rows, width = 8, 6
    lengths = torch.randint(1, width + 1, (rows,), generator=g)
    mask = (torch.arange(width) < lengths.unsqueeze(-1)).float()
    if holes:
        mask[::2, 1] = 0.0
    rewards = torch.randn(rows, width, generator=g) * mask
    old = -torch.rand(rows, width, generator=g) * 3
    spp = torch.rand(rows, width, generator=g) * 0.5
    index = [f"p{i % 3}" for i in range(rows)]
    return rewards, mask, index, old, spp


@pytest.mark.parametrize("seed", range(3))
def test_tir_equals_otb_without_holes(seed):
    rewards, mask, index, old, spp = _random_case(seed, holes=False)
    a, ra = compute_optimal_token_baseline_advantage(rewards, mask, index, old, spp)
    b, rb = compute_multi_turn_optimal_token_baseline_advantage(rewards, mask, index, old, spp)
    assert torch.allclose(a, b, atol=1e-6) and torch.equal(ra, rb)


def test_tir_baselines_compacted_positions():
    # row 0 has a hole at t1: its 2nd generated token sits at t2 and shares a baseline with
    # row 1's 2nd generated token at t1.
    rewards = torch.tensor([[0.0, 0.0, 1.0], [0.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 0.0, 1.0], [1.0, 1.0, 0.0]])
    old = torch.full((2, 3), HALF)
    spp = torch.full((2, 3), 0.5)  # w = 0.5 on valid tokens → W_compact = [0.5, 1.0] for both
    adv, ret = compute_multi_turn_optimal_token_baseline_advantage(rewards, mask, ["g", "g"], old, spp)
    # compacted G: row 0 = [1, 1], row 1 = [0, 0]; equal W → B = [0.5, 0.5]
    assert adv.tolist() == [pytest.approx([0.5, 0.0, 0.5]), pytest.approx([-0.5, -0.5, 0.0])]
    assert ret[0].tolist() == [1.0, 1.0, 1.0]


def test_tir_ignores_empty_rows():
    rewards = torch.tensor([[0.0, 1.0], [0.0, 0.0], [0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0], [0.0, 0.0], [1.0, 1.0]])
    old, spp = torch.full((3, 2), HALF), torch.full((3, 2), 0.5)
    adv, _ = compute_multi_turn_optimal_token_baseline_advantage(rewards, mask, ["g", "g", "g"], old, spp)
    assert adv[0].tolist() == pytest.approx([0.5, 0.5])
    assert (adv[1] == 0).all()
