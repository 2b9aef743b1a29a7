"""Rollout-correction weights / rejection, and the bypass-mode loss built on them."""

import math

import pytest
import torch

from hybridflow.algorithms.policy_losses import compute_policy_loss_bypass_mode, compute_policy_loss_vanilla
from hybridflow.algorithms.rollout_correction import (
    compute_rollout_correction,
    compute_rollout_is_weights,
    compute_rollout_rejection_mask,
)

# ℓ_train − ℓ_rollout = ln 3 and ln 0.5 (ratios 3 and 0.5)
ROLLOUT = torch.zeros(1, 2)
TRAIN = torch.tensor([[math.log(3.0), math.log(0.5)]])
MASK = torch.ones(1, 2)
DELTA = TRAIN - ROLLOUT


def test_token_truncated_is_by_hand():
    weights, metrics = compute_rollout_is_weights(DELTA, MASK, "token", 2.0)
    assert weights.tolist() == [pytest.approx([2.0, 0.5])]
    assert metrics["rollout_is_ratio_fraction_high"].item() == 0.5
    assert not weights.requires_grad


def test_sequence_is_uses_the_product_of_ratios():
    weights, _ = compute_rollout_is_weights(DELTA, MASK, "sequence", 2.0)
    assert weights.tolist() == [pytest.approx([1.5, 1.5])]  # 3 · 0.5


def test_icepop_zeroes_out_of_band_weights():
    weights, _ = compute_rollout_is_weights(DELTA, MASK, "token", "0.6_2")
    assert weights.tolist() == [pytest.approx([0.0, 0.0])]
    weights, _ = compute_rollout_is_weights(DELTA, MASK, "token", "0.5_2")
    assert weights.tolist() == [pytest.approx([0.0, 0.5])]


def test_batch_normalize_gives_mean_one():
    weights, metrics = compute_rollout_is_weights(DELTA, MASK, "token", 2.0, rollout_is_batch_normalize=True)
    assert weights.tolist() == [pytest.approx([1.6, 0.4])]
    assert metrics["rollout_is_batch_norm_factor"].item() == pytest.approx(1.25)


@pytest.mark.parametrize("bad", ["tokens", None])
def test_bad_is_level(bad):
    with pytest.raises(ValueError, match="rollout_is"):
        compute_rollout_is_weights(DELTA, MASK, bad, 2.0)


@pytest.mark.parametrize("bad", ["2_1", "x", -1.0, True])
def test_bad_is_threshold(bad):
    with pytest.raises(ValueError, match="rollout_is_threshold"):
        compute_rollout_is_weights(DELTA, MASK, "token", bad)


@pytest.mark.parametrize(
    ("option", "threshold", "kept"),
    [
        ("token_k2", 0.5, [0.0, 1.0]),  # ½ ln²3 = 0.603 rejected, ½ ln²2 = 0.240 kept
        ("token_k1", 2.5, [0.0, 1.0]),  # −δ = [−ln 3, ln 2] vs [ln 0.4, ln 2.5] = [−0.916, 0.916]
        ("seq_sum_k1", "0.5_2", [1.0, 1.0]),  # Σ −δ = −ln 1.5 = −0.405 ∈ [−0.693, 0.693]
        ("seq_sum_k1", "0.8_1.25", [0.0, 0.0]),  # −0.405 < ln 0.8 = −0.223 → whole row rejected
        ("seq_max_k2", 0.5, [0.0, 0.0]),
        ("seq_mean_k3", 10.0, [1.0, 1.0]),
    ],
)
def test_rejection_options(option, threshold, kept):
    mask, metrics = compute_rollout_rejection_mask(DELTA, MASK, option, threshold)
    assert mask.tolist() == [kept]
    assert metrics["rollout_rs_masked_fraction"].item() == pytest.approx(1 - sum(kept) / 2)


def test_rejection_options_combine_and_validate():
    mask, _ = compute_rollout_rejection_mask(DELTA, MASK, "token_k2,seq_mean_k3", "0.5,10")
    assert mask.tolist() == [[0.0, 1.0]]
    with pytest.raises(ValueError, match="valid options"):
        compute_rollout_rejection_mask(DELTA, MASK, "token_k4", 1.0)
    with pytest.raises(ValueError, match="entries"):
        compute_rollout_rejection_mask(DELTA, MASK, "token_k2,token_k3", "1,2,3")
    with pytest.raises(ValueError, match="single upper"):
        compute_rollout_rejection_mask(DELTA, MASK, "token_k2", "0.1_1")
    with pytest.raises(ValueError, match="binary_kl"):
        compute_rollout_rejection_mask(DELTA, MASK, "binary_kl", 1.0)


def test_binary_kl_rejection():
    old = torch.tensor([[math.log(0.5), math.log(0.5)]])
    rollout = torch.tensor([[math.log(0.9), math.log(0.52)]])
    mask, _ = compute_rollout_rejection_mask(old - rollout, MASK, "binary_kl", 0.1, old, rollout)
    assert mask.tolist() == [[0.0, 1.0]]  # Bernoulli KL(0.5‖0.9) ≈ 0.51, KL(0.5‖0.52) ≈ 0.0008


def test_compute_rollout_correction_prefixes_metrics():
    weights, mask, metrics = compute_rollout_correction(TRAIN, ROLLOUT, MASK, rollout_is="token")
    assert weights.tolist() == [pytest.approx([2.0, 0.5])] and torch.equal(mask, MASK)
    assert metrics["rollout_corr/kl"].item() == pytest.approx(-(math.log(3) + math.log(0.5)) / 2, rel=1e-6)
    assert all(key.startswith("rollout_corr/") for key in metrics)
    none, _, _ = compute_rollout_correction(TRAIN, ROLLOUT, MASK)
    assert none is None
    with pytest.raises(ValueError, match="rollout_rs_threshold"):
        compute_rollout_correction(TRAIN, ROLLOUT, MASK, rollout_rs="token_k2")


# --- bypass mode -------------------------------------------------------------------------------


def test_bypass_ppo_clip_equals_vanilla_against_rollout_log_probs():
    g = torch.Generator().manual_seed(0)
    rollout = -torch.rand(3, 4, generator=g)
    logp = rollout + 0.3 * torch.randn(3, 4, generator=g)
    adv = torch.randn(3, 4, generator=g)
    mask = torch.ones(3, 4)
    bypass, metrics = compute_policy_loss_bypass_mode(rollout, logp, adv, mask, rollout_is="token")
    vanilla, _ = compute_policy_loss_vanilla(rollout, logp, adv, mask)
    assert bypass.item() == pytest.approx(vanilla.item(), rel=1e-6)
    assert "rollout_corr/rollout_is_mean" in metrics


def test_bypass_reinforce_by_hand():
    logp = TRAIN.clone().requires_grad_()
    adv = torch.ones(1, 2)
    loss, _ = compute_policy_loss_bypass_mode(ROLLOUT, logp, adv, MASK, loss_type="reinforce", rollout_is="token")
    # −A·ℓ·w with w = [2, 0.5]
    assert loss.item() == pytest.approx((-2 * math.log(3) + 0.5 * math.log(2)) / 2, rel=1e-6)
    loss.backward()
    assert logp.grad[0].tolist() == pytest.approx([-1.0, -0.25])  # w is detached
    seq, _ = compute_policy_loss_bypass_mode(ROLLOUT, TRAIN, adv, MASK, loss_type="reinforce", rollout_is="sequence")
    assert seq.item() == pytest.approx(-1.5 * math.log(1.5) / 2, rel=1e-6)


def test_bypass_reinforce_with_rejection():
    loss, metrics = compute_policy_loss_bypass_mode(
        ROLLOUT, TRAIN, torch.ones(1, 2), MASK, loss_type="reinforce", rollout_is="token",
        rollout_rs="token_k2", rollout_rs_threshold=0.5,
    )  # fmt: skip
    assert loss.item() == pytest.approx(0.5 * math.log(2), rel=1e-6)  # only the kept token, mean over 1
    assert metrics["rollout_corr/rollout_rs_masked_fraction"].item() == 0.5


def test_bypass_rejects_unknown_loss_type():
    with pytest.raises(ValueError, match="reinforce"):
        compute_policy_loss_bypass_mode(ROLLOUT, TRAIN, torch.ones(1, 2), MASK, loss_type="ppo")
