"""Policy losses combined over micro-batches and data-parallel shards equal the full batch."""

import pytest
import torch

from hybridflow.algorithms.aggregation import LOSS_AGG_MODES, GlobalBatchInfo, global_batch_info_for
from hybridflow.algorithms.policy_losses import get_policy_loss_fn, select_policy_loss_params
from hybridflow.algorithms.value_loss import compute_value_loss

SCALARS = {"clip_ratio_low": 0.2, "clip_ratio_high": 0.28, "clip_ratio_c": 3.0, "dro_beta": 0.1}
ROWS, WIDTH = 8, 6


def _data():
    g = torch.Generator().manual_seed(11)
    features = torch.randn(ROWS, WIDTH, 3, generator=g, dtype=torch.float64)
    old = -torch.rand(ROWS, WIDTH, generator=g, dtype=torch.float64) * 2
    adv = torch.randn(ROWS, WIDTH, generator=g, dtype=torch.float64)
    lengths = torch.tensor([6, 2, 0, 4, 5, 1, 3, 6])
    mask = (torch.arange(WIDTH) < lengths.unsqueeze(-1)).to(torch.float64)
    return features, old, adv, mask


def _log_prob(theta, features, old):
    # a small "model": log-probs move away from the old ones as θ moves away from 0
    return old + 0.3 * torch.tanh(features @ theta)


def _run(name, mode, theta, rows, info):
    features, old, adv, mask = _data()
    fn = get_policy_loss_fn(name)
    loss, _ = fn(
        old[rows], _log_prob(theta, features[rows], old[rows]), adv[rows], mask[rows], mode,
        **select_policy_loss_params(name, SCALARS), global_batch_info=info,
    )  # fmt: skip
    loss.backward()
    return loss.detach()


CASES = [("vanilla", mode) for mode in LOSS_AGG_MODES] + [
    ("gspo", "seq-mean-token-mean"),
    ("sapo", "seq-mean-token-mean"),
    ("geo_mean", "token-mean"),
    ("cispo", "token-mean"),
    ("gpg", "seq-mean-token-sum"),
    ("dppo_tv", "token-mean"),
    ("dro", "seq-mean-token-mean"),
]


@pytest.mark.parametrize(("name", "mode"), CASES)
def test_micro_batches_and_dp_shards_match_full_batch(name, mode):
    theta0 = torch.tensor([0.4, -0.3, 0.2], dtype=torch.float64)
    everything = list(range(ROWS))
    full_theta = theta0.clone().requires_grad_()
    full_loss = _run(name, mode, full_theta, everything, GlobalBatchInfo(loss_scale_factor=WIDTH))
    mask = _data()[3]

    micro_theta = theta0.clone().requires_grad_()
    info = global_batch_info_for(mask, dp_size=1, loss_scale_factor=WIDTH)
    micro_total = sum(_run(name, mode, micro_theta, everything[i : i + 2], info) for i in range(0, ROWS, 2))
    assert micro_total.item() == pytest.approx(full_loss.item(), abs=1e-6)
    assert torch.allclose(micro_theta.grad, full_theta.grad, atol=1e-6)

    dp_info = global_batch_info_for(mask, dp_size=2, loss_scale_factor=WIDTH)
    shard_losses, shard_grads = [], []
    for shard in (everything[:4], everything[4:]):
        theta = theta0.clone().requires_grad_()
        shard_losses.append(sum(_run(name, mode, theta, shard[i : i + 2], dp_info) for i in (0, 2)))
        shard_grads.append(theta.grad)
    assert (sum(shard_losses) / 2).item() == pytest.approx(full_loss.item(), abs=1e-6)
    assert torch.allclose((shard_grads[0] + shard_grads[1]) / 2, full_theta.grad, atol=1e-6)


def test_value_loss_micro_batches_match_full_batch():
    features, _, adv, mask = _data()
    theta0 = torch.tensor([0.1, 0.5, -0.2], dtype=torch.float64)
    values = features[..., 1].detach()

    def run(theta, rows, info):
        vpreds = features[rows] @ theta
        loss, _ = compute_value_loss(vpreds, adv[rows], values[rows], mask[rows], 0.2, "token-mean",
                                     global_batch_info=info)  # fmt: skip
        loss.backward()
        return loss.detach()

    full_theta = theta0.clone().requires_grad_()
    full = run(full_theta, list(range(ROWS)), None)
    micro_theta = theta0.clone().requires_grad_()
    info = global_batch_info_for(mask)
    total = sum(run(micro_theta, [i, i + 1], info) for i in range(0, ROWS, 2))
    assert total.item() == pytest.approx(full.item(), abs=1e-6)
    assert torch.allclose(micro_theta.grad, full_theta.grad, atol=1e-6)
