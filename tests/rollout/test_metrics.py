"""``rollout/actor_logprob_diff`` against hand-computed values."""

from __future__ import annotations

import pytest
import torch

from hybridflow.workers.rollout import actor_logprob_diff


def test_max_and_mean_over_response_tokens_only():
    rollout = torch.tensor([[-1.0, -2.0, -3.0], [-0.5, -0.5, 0.0]])
    actor = torch.tensor([[-1.1, -2.0, -9.0], [-0.2, -0.5, 0.0]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 0]])
    metrics = actor_logprob_diff(rollout, actor, mask)
    # |diffs| on masked tokens: 0.1, 0, 0.3, 0 → max 0.3, mean 0.1 (the 6.0 is padding)
    assert metrics["rollout/actor_logprob_diff"] == pytest.approx(0.3)
    assert metrics["rollout/actor_logprob_diff_mean"] == pytest.approx(0.1)


def test_empty_mask_and_shape_errors():
    zeros = torch.zeros(2, 3)
    assert actor_logprob_diff(zeros, zeros + 1, torch.zeros(2, 3)) == {
        "rollout/actor_logprob_diff": 0.0,
        "rollout/actor_logprob_diff_mean": 0.0,
    }
    with pytest.raises(ValueError, match="shape mismatch: rollout_log_probs"):
        actor_logprob_diff(zeros, torch.zeros(2, 4), torch.zeros(2, 3))
