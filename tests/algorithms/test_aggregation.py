"""agg_loss: hand-computed values per mode and exact micro-batch / data-parallel split invariance."""

import pytest
import torch

from hybridflow.algorithms.aggregation import (
    LOSS_AGG_MODES,
    GlobalBatchInfo,
    agg_loss,
    global_batch_info_for,
)

L = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 9.0]])
M = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0], [0.0, 0.0, 0.0]])  # row 2 is empty

# rows: Σ = 3 (2 tokens), 15 (3 tokens); N = 5 tokens, S = 2 non-empty sequences, T = 3
HAND = {
    "token-mean": 18 / 5,
    "token-sum": 18.0,
    "seq-mean-token-sum": (3 + 15) / 2,
    "seq-mean-token-mean": (1.5 + 5.0) / 2,
    "seq-mean-token-sum-norm": (3 + 15) / 2 / 3,
}


def test_modes_listed():
    assert set(LOSS_AGG_MODES) == set(HAND)


@pytest.mark.parametrize("mode", sorted(HAND))
def test_each_mode_by_hand(mode):
    assert agg_loss(L, M, mode).item() == pytest.approx(HAND[mode], rel=1e-6)


def test_norm_mode_uses_the_given_constant():
    assert agg_loss(L, M, "seq-mean-token-sum-norm", loss_scale_factor=6).item() == pytest.approx(1.5)


def test_global_counts_override_local_ones_and_scale_by_dp_size():
    assert agg_loss(L, M, "token-mean", batch_num_tokens=10).item() == pytest.approx(1.8)
    assert agg_loss(L, M, "token-mean", dp_size=2, batch_num_tokens=10).item() == pytest.approx(3.6)
    assert agg_loss(L, M, "seq-mean-token-mean", dp_size=3, global_batch_size=4).item() == pytest.approx(
        6.5 / 4 * 3
    )


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean"])
def test_dp_size_without_global_count_is_an_error(mode):
    with pytest.raises(ValueError, match="global"):
        agg_loss(L, M, mode, dp_size=2)


@pytest.mark.parametrize("mode", sorted(HAND))
def test_empty_mask_gives_zero_not_nan(mode):
    assert agg_loss(L, torch.zeros_like(M), mode).item() == 0.0


def test_nan_at_masked_position_is_ignored_but_at_valid_position_raises():
    bad = L.clone()
    bad[2, 0] = float("nan")  # row 2 is masked out
    assert agg_loss(bad, M, "token-mean").item() == pytest.approx(3.6)
    bad[0, 0] = float("inf")
    with pytest.raises(ValueError, match="NaN/inf"):
        agg_loss(bad, M, "token-mean")


def test_unknown_mode_lists_valid_modes():
    with pytest.raises(ValueError, match="seq-mean-token-mean"):
        agg_loss(L, M, "mean")


def test_shape_mismatch_raises():
    with pytest.raises(ValueError, match="differ"):
        agg_loss(L, M[:, :2], "token-mean")


def test_global_batch_info_validation_and_counts():
    with pytest.raises(ValueError, match="dp_size"):
        GlobalBatchInfo(dp_size=0)
    info = global_batch_info_for(M, dp_size=2, loss_scale_factor=3.0)
    assert (int(info.batch_num_tokens), int(info.global_batch_size), info.dp_size) == (5, 2, 2)


# --- split invariance -------------------------------------------------------------------------


def _batch(seed: int = 0, rows: int = 8, tokens: int = 6):
    g = torch.Generator().manual_seed(seed)
    features = torch.randn(rows, tokens, 4, generator=g, dtype=torch.float64)
    lengths = torch.tensor([6, 1, 3, 0, 5, 2, 6, 4])  # one empty row, unequal lengths
    mask = (torch.arange(tokens) < lengths.unsqueeze(-1)).to(torch.float64)
    return features, mask


def _loss_mat(theta: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
    return torch.tanh(features @ theta) ** 2 + features[..., 0] * theta[0]


def _full(mode: str, theta0: torch.Tensor, features, mask, scale):
    theta = theta0.clone().requires_grad_()
    loss = agg_loss(_loss_mat(theta, features), mask, mode, loss_scale_factor=scale)
    loss.backward()
    return loss.detach(), theta.grad


def _accumulate(mode, theta, features, mask, rows, info, trim):
    """Sum of micro-batch losses (backward on each, no division), as the actor does."""
    total = torch.zeros((), dtype=torch.float64)
    for part in rows:
        f, m = features[part], mask[part]
        if trim:  # micro-batches padded only to their own longest row
            width = max(int(m.sum(-1).max()), 1)
            f, m = f[:, :width], m[:, :width]
        loss = agg_loss(
            _loss_mat(theta, f),
            m,
            mode,
            dp_size=info.dp_size,
            batch_num_tokens=info.batch_num_tokens,
            global_batch_size=info.global_batch_size,
            loss_scale_factor=info.loss_scale_factor,
        )
        loss.backward()
        total = total + loss.detach()
    return total


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
@pytest.mark.parametrize("trim", [False, True])
def test_four_micro_batches_equal_the_full_batch(mode, trim):
    features, mask = _batch()
    theta0 = torch.tensor([0.3, -0.2, 0.5, 0.1], dtype=torch.float64)
    full_loss, full_grad = _full(mode, theta0, features, mask, scale=6.0)
    info = global_batch_info_for(mask, dp_size=1, loss_scale_factor=6.0)
    theta = theta0.clone().requires_grad_()
    parts = [list(range(i, i + 2)) for i in range(0, 8, 2)]
    total = _accumulate(mode, theta, features, mask, parts, info, trim)
    assert total.item() == pytest.approx(full_loss.item(), abs=1e-6)
    assert torch.allclose(theta.grad, full_grad, atol=1e-6)


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_two_data_parallel_shards_with_micro_batches_equal_the_full_batch(mode):
    features, mask = _batch(seed=3)
    theta0 = torch.tensor([-0.4, 0.2, 0.1, 0.7], dtype=torch.float64)
    full_loss, full_grad = _full(mode, theta0, features, mask, scale=6.0)
    # the counts are all-reduced over both shards before the first micro-batch
    info = global_batch_info_for(mask, dp_size=2, loss_scale_factor=6.0)
    shard_rows = [[0, 1, 2, 3], [4, 5, 6, 7]]
    shard_losses, shard_grads = [], []
    for rows in shard_rows:
        theta = theta0.clone().requires_grad_()
        micro = [rows[:2], rows[2:]]
        shard_losses.append(_accumulate(mode, theta, features, mask, micro, info, trim=False))
        shard_grads.append(theta.grad)
    # DDP / FSDP average gradients (and logged losses) over ranks
    assert (sum(shard_losses) / 2).item() == pytest.approx(full_loss.item(), abs=1e-6)
    assert torch.allclose((shard_grads[0] + shard_grads[1]) / 2, full_grad, atol=1e-6)
