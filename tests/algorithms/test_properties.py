"""Randomised properties (hypothesis) of the estimators and KL."""

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hybridflow.algorithms.advantages import (
    compute_grpo_outcome_advantage,
    compute_grpo_vectorized_outcome_advantage,
    compute_rloo_outcome_advantage,
)
from hybridflow.algorithms.kl import kl_penalty

scores_strategy = st.lists(st.floats(-5, 5, allow_nan=False, width=32), min_size=2, max_size=12)


@settings(max_examples=60, deadline=None)
@given(scores=scores_strategy, groups=st.integers(1, 4))
def test_grpo_groups_sum_to_zero_and_match_vectorized(scores, groups):
    index = np.array([f"g{i % groups}" for i in range(len(scores))], dtype=object)
    rewards = torch.tensor(scores).unsqueeze(-1)
    mask = torch.ones_like(rewards)
    loop, _ = compute_grpo_outcome_advantage(rewards, mask, index, norm_adv_by_std_in_grpo=False)
    vec, _ = compute_grpo_vectorized_outcome_advantage(rewards, mask, index, norm_adv_by_std_in_grpo=False)
    assert torch.allclose(loop, vec, atol=1e-4)
    for g in range(groups):
        rows = [i for i in range(len(scores)) if index[i] == f"g{g}"]
        if len(rows) > 1:
            assert abs(loop[rows].sum().item()) < 1e-4


@settings(max_examples=60, deadline=None)
@given(scores=scores_strategy)
def test_rloo_is_score_minus_mean_of_the_others(scores):
    rewards = torch.tensor(scores, dtype=torch.float64).unsqueeze(-1)
    adv, _ = compute_rloo_outcome_advantage(rewards, torch.ones_like(rewards), ["p"] * len(scores))
    for i, s in enumerate(scores):
        others = [x for j, x in enumerate(scores) if j != i]
        assert abs(adv[i, 0].item() - (s - sum(others) / len(others))) < 1e-6


@settings(max_examples=100, deadline=None)
@given(logp=st.floats(-30, 0, allow_nan=False, width=32), ref=st.floats(-30, 0, allow_nan=False, width=32))
def test_k3_is_nonnegative(logp, ref):
    assert kl_penalty(torch.tensor([logp]), torch.tensor([ref]), "k3").item() >= 0.0
