"""Group-relative outcome estimators against hand-computed numbers, plus their properties."""

import math

import numpy as np
import pytest
import torch

from hybridflow.algorithms.advantages import (
    compute_gdpo_outcome_advantage,
    compute_gpg_outcome_advantage,
    compute_grpo_outcome_advantage,
    compute_grpo_passk_outcome_advantage,
    compute_grpo_vectorized_outcome_advantage,
    compute_opo_outcome_advantage,
    compute_reinforce_plus_plus_baseline_outcome_advantage,
    compute_rloo_outcome_advantage,
    compute_rloo_vectorized_outcome_advantage,
)
from hybridflow.algorithms.utils import masked_whiten

# Six rows: group "a" = rows 0-2 (scores 1, 0, 1), "b" = rows 3-4 (1, 0), "c" = row 5 alone (0.5).
INDEX = np.array(["a", "a", "a", "b", "b", "c"], dtype=object)
SCORES = [1.0, 0.0, 1.0, 1.0, 0.0, 0.5]
LENGTHS = [2, 3, 1, 3, 3, 2]
T = 3


def _batch(scores=SCORES, lengths=LENGTHS):
    mask = (torch.arange(T) < torch.tensor(lengths).unsqueeze(-1)).float()
    rewards = torch.zeros(len(scores), T)
    for i, (s, n) in enumerate(zip(scores, lengths)):
        rewards[i, max(n - 1, 0)] = s  # outcome reward on the last valid token
    return rewards, mask


def _scalars(advantages, mask):
    """The per-row scalar an outcome estimator broadcast over its valid tokens."""
    return (advantages.sum(-1) / mask.sum(-1).clamp(min=1)).tolist()


SQRT3 = 1 / math.sqrt(3)  # σ of (1, 0, 1) is √(1/3)
GRPO_HAND = [
    (1 / 3) / (SQRT3 + 1e-6),
    (-2 / 3) / (SQRT3 + 1e-6),
    (1 / 3) / (SQRT3 + 1e-6),
    0.5 / (math.sqrt(0.5) + 1e-6),
    -0.5 / (math.sqrt(0.5) + 1e-6),
    0.5 / (1 + 1e-6),  # group of one: μ = 0, σ = 1
]


@pytest.mark.parametrize("fn", [compute_grpo_outcome_advantage, compute_grpo_vectorized_outcome_advantage])
def test_grpo_by_hand(fn):
    rewards, mask = _batch()
    adv, ret = fn(rewards, mask, INDEX)
    assert _scalars(adv, mask) == pytest.approx(GRPO_HAND, rel=1e-6)
    assert torch.equal(adv, ret)
    assert (adv[mask == 0] == 0).all()
    dr, _ = fn(rewards, mask, INDEX, norm_adv_by_std_in_grpo=False)  # Dr.GRPO
    assert _scalars(dr, mask) == pytest.approx([1 / 3, -2 / 3, 1 / 3, 0.5, -0.5, 0.5], rel=1e-6)


def test_grpo_group_sums_to_zero_and_vectorized_agrees():
    g = torch.Generator().manual_seed(0)
    index = np.array([f"p{i // 4}" for i in range(16)], dtype=object)
    rewards = torch.rand(16, 5, generator=g)
    mask = torch.ones(16, 5)
    loop, _ = compute_grpo_outcome_advantage(rewards, mask, index)
    vec, _ = compute_grpo_vectorized_outcome_advantage(rewards, mask, index)
    assert torch.allclose(loop, vec, atol=1e-5)
    for group in range(4):
        assert loop[group * 4 : group * 4 + 4, 0].sum().item() == pytest.approx(0.0, abs=1e-5)


@pytest.mark.parametrize("fn", [compute_grpo_outcome_advantage, compute_grpo_vectorized_outcome_advantage])
def test_grpo_all_equal_scores_give_zero(fn):
    rewards, mask = _batch(scores=[1.0, 1.0, 1.0, 0.5, 0.5, 0.0])
    adv, _ = fn(rewards, mask, INDEX)
    assert torch.equal(adv, torch.zeros_like(adv))


def test_index_may_be_a_tensor_or_list():
    rewards, mask = _batch()
    as_array, _ = compute_grpo_outcome_advantage(rewards, mask, INDEX)
    as_tensor, _ = compute_grpo_outcome_advantage(rewards, mask, torch.tensor([7, 7, 7, 3, 3, 9]))
    as_list, _ = compute_grpo_outcome_advantage(rewards, mask, list(INDEX))
    assert torch.equal(as_array, as_tensor) and torch.equal(as_array, as_list)
    with pytest.raises(ValueError, match="index has 2 entries"):
        compute_grpo_outcome_advantage(rewards, mask, ["a", "b"])


def test_rloo_is_score_minus_mean_of_others():
    rewards, mask = _batch()
    adv, _ = compute_rloo_outcome_advantage(rewards, mask, INDEX)
    # a: 1 − (0+1)/2, 0 − (1+1)/2, ...; b: 1 − 0, 0 − 1; c alone keeps its score
    assert _scalars(adv, mask) == pytest.approx([0.5, -1.0, 0.5, 1.0, -1.0, 0.5], rel=1e-6)
    vec, _ = compute_rloo_vectorized_outcome_advantage(rewards, mask, INDEX)
    assert torch.allclose(vec[:5], adv[:5], atol=1e-6)
    assert (vec[5] == 0).all()  # the vectorised version zeroes groups of one (as verl)


def test_rloo_loop_and_vectorized_agree_on_random_groups():
    g = torch.Generator().manual_seed(1)
    index = np.array([f"p{int(i)}" for i in torch.randint(0, 5, (20,), generator=g)], dtype=object)
    index[:2] = "pair"  # make sure at least one group has n > 1
    rewards, mask = torch.randn(20, 4, generator=g), torch.ones(20, 4)
    loop, _ = compute_rloo_outcome_advantage(rewards, mask, index)
    vec, _ = compute_rloo_vectorized_outcome_advantage(rewards, mask, index)
    sizes = {k: list(index).count(k) for k in set(index)}
    multi = torch.tensor([sizes[k] > 1 for k in index])
    assert torch.allclose(loop[multi], vec[multi], atol=1e-5)


def test_opo_length_weighted_baseline_by_hand():
    rewards, mask = _batch()
    adv, _ = compute_opo_outcome_advantage(rewards, mask, INDEX)
    # a: b = (2·1 + 3·0 + 1·1)/6 = 0.5; b: (3·1 + 3·0)/6 = 0.5; c alone: b = 0
    assert _scalars(adv, mask) == pytest.approx([0.5, -0.5, 0.5, 0.5, -0.5, 0.5], rel=1e-6)


def test_gpg_by_hand():
    rewards, mask = _batch()
    adv, _ = compute_gpg_outcome_advantage(rewards, mask, INDEX)
    # α = 6 / 4 non-zero scores = 1.5; group means 2/3, 0.5, (alone) 0
    assert _scalars(adv, mask) == pytest.approx([0.5, -1.0, 0.5, 0.75, -0.75, 0.75], rel=1e-6)


def test_grpo_passk_by_hand():
    index = np.array(["a", "a", "a", "b", "b"], dtype=object)
    rewards, mask = _batch(scores=[1.0, 0.0, 0.5, 0.0, 2.0], lengths=[3, 3, 3, 2, 2])
    adv, _ = compute_grpo_passk_outcome_advantage(rewards, mask, index)
    # a: best 1, second 0.5, σ(1, 0, 0.5) = 0.5 → 0.5/0.500001; b: best 2, second 0, σ = √2
    assert _scalars(adv, mask) == pytest.approx([0.5 / 0.500001, 0, 0, 0, 2 / (math.sqrt(2) + 1e-6)], rel=1e-6)
    raw, _ = compute_grpo_passk_outcome_advantage(rewards, mask, index, norm_adv_by_std_in_grpo=False)
    assert _scalars(raw, mask) == pytest.approx([0.5, 0, 0, 0, 2.0])
    with pytest.raises(ValueError, match="at least 2"):
        compute_grpo_passk_outcome_advantage(rewards[:4], mask[:4], index[:4].tolist()[:3] + ["z"])


def test_reinforce_plus_plus_baseline_by_hand():
    rewards, mask = _batch(scores=[1.0, 0.0], lengths=[2, 2])
    adv, _ = compute_reinforce_plus_plus_baseline_outcome_advantage(rewards, mask, ["g", "g"])
    # centred ±0.5 on 4 tokens: mean 0, unbiased var = 4·0.25/3 → ±0.5/√(1/3) = ±0.866025
    expected = 0.5 / math.sqrt(1 / 3)
    assert adv[:, :2].tolist() == [pytest.approx([expected] * 2, rel=1e-6), pytest.approx([-expected] * 2, rel=1e-6)]
    assert (adv[:, 2] == 0).all()


def test_gdpo_normalises_each_component_in_its_group():
    index = ["g", "g", "g"]
    rewards, mask = _batch(scores=[0.0, 0.0, 0.0], lengths=[1, 1, 1])
    components = torch.tensor([[1.0, 10.0], [0.0, 10.0], [0.0, 0.0]])
    adv, ret = compute_gdpo_outcome_advantage(rewards, mask, index, reward_components=components)
    # per component: [1.1547, −0.5774, −0.5774] + [0.5774, 0.5774, −1.1547] = [1.7320, 0, −1.7320];
    # whitened over 3 tokens (unbiased var 3) → [1, 0, −1]
    assert adv[:, 0].tolist() == pytest.approx([1.0, 0.0, -1.0], abs=1e-5)
    assert torch.equal(adv, ret)
    weighted, _ = compute_gdpo_outcome_advantage(
        rewards, mask, index, reward_components=components, gdpo_reward_weights=[1.0, 0.0]
    )
    # only the first component: [1.1547, −0.5774, −0.5774] whitened (unbiased var 1) → same values
    assert weighted[:, 0].tolist() == pytest.approx([2 / math.sqrt(3), -1 / math.sqrt(3), -1 / math.sqrt(3)], rel=1e-5)
    with pytest.raises(ValueError, match="gdpo_reward_weights"):
        compute_gdpo_outcome_advantage(rewards, mask, index, reward_components=components, gdpo_reward_weights=[1.0])


def test_gdpo_without_components_is_whitened_grpo():
    rewards, mask = _batch()
    adv, _ = compute_gdpo_outcome_advantage(rewards, mask, INDEX)
    grpo, _ = compute_grpo_outcome_advantage(rewards, mask, INDEX)
    assert torch.allclose(adv, masked_whiten(grpo, mask) * mask, atol=1e-6)
