"""KL estimators, straight-through variants, controllers and the in-reward penalty."""

import math

import pytest
import torch

from hybridflow.algorithms.kl import (
    KL_ESTIMATORS,
    AdaptiveKLController,
    FixedKLController,
    apply_kl_penalty,
    check_kl_penalty_name,
    get_kl_controller,
    kl_penalty,
)

LN2 = math.log(2.0)
# ℓ = ln 0.5, ℓ_ref = ln 0.25  →  d = ℓ − ℓ_ref = ln 2; second column swaps them (d = −ln 2)
LOGP = torch.tensor([math.log(0.5), math.log(0.25)])
REF = torch.tensor([math.log(0.25), math.log(0.5)])

HAND = {
    "kl": [LN2, -LN2],
    "k1": [LN2, -LN2],
    "abs": [LN2, LN2],
    "mse": [0.5 * LN2**2, 0.5 * LN2**2],  # 0.240227
    "k2": [0.5 * LN2**2, 0.5 * LN2**2],
    # u = ℓ_ref − ℓ: exp(−ln2) + ln2 − 1 = 0.193147;  exp(ln2) − ln2 − 1 = 0.306853
    "low_var_kl": [0.5 + LN2 - 1, 2 - LN2 - 1],
    "k3": [0.5 + LN2 - 1, 2 - LN2 - 1],
}


@pytest.mark.parametrize("name", sorted(HAND))
def test_estimators_by_hand(name):
    assert kl_penalty(LOGP, REF, name).tolist() == pytest.approx(HAND[name], rel=1e-6)


def test_k3_is_nonnegative_and_clamped():
    torch.manual_seed(0)
    logp, ref = torch.randn(1000) * 3, torch.randn(1000) * 3
    assert (kl_penalty(logp, ref, "k3") >= 0).all()
    # ℓ − ℓ_ref = −30: u clamps to 20, exp(20) − 21 clamps to 10
    assert kl_penalty(torch.tensor([-30.0]), torch.tensor([0.0]), "k3").item() == 10.0


@pytest.mark.parametrize("base", ["k1", "kl", "k3", "low_var_kl", "abs"])
def test_straight_through_has_base_value_and_k2_gradient(base):
    logp = LOGP.clone().requires_grad_()
    value = kl_penalty(logp, REF, base + "+")
    assert value.tolist() == pytest.approx(HAND[base], rel=1e-6)
    value.sum().backward()
    # d/dℓ ½(ℓ − ℓ_ref)² = ℓ − ℓ_ref
    assert logp.grad.tolist() == pytest.approx([LN2, -LN2], rel=1e-6)


def test_plain_k3_gradient_differs_from_k2():
    logp = LOGP.clone().requires_grad_()
    kl_penalty(logp, REF, "k3").sum().backward()
    # d/dℓ [exp(ℓ_ref − ℓ) − (ℓ_ref − ℓ) − 1] = 1 − exp(ℓ_ref − ℓ) = [0.5, −1]
    assert logp.grad.tolist() == pytest.approx([0.5, -1.0], rel=1e-6)


def test_k2_plus_is_k2():
    assert torch.equal(kl_penalty(LOGP, REF, "k2+"), kl_penalty(LOGP, REF, "k2"))


def test_unknown_estimator_lists_names():
    with pytest.raises(ValueError, match="low_var_kl"):
        kl_penalty(LOGP, REF, "full")
    with pytest.raises(ValueError, match="unknown"):
        kl_penalty(LOGP, REF, "K3")  # case-sensitive


def test_custom_estimator_registers_and_gets_straight_through():
    def doubled_k1(logprob, ref_logprob):
        return 2 * (logprob - ref_logprob)

    KL_ESTIMATORS.register("test_doubled_k1")(doubled_k1)
    KL_ESTIMATORS.register("test_doubled_k1")(doubled_k1)  # same function again: no-op
    logp = LOGP.clone().requires_grad_()
    value = kl_penalty(logp, REF, "test_doubled_k1+")
    assert value.tolist() == pytest.approx([2 * LN2, -2 * LN2], rel=1e-6)
    value.sum().backward()
    assert logp.grad.tolist() == pytest.approx([LN2, -LN2], rel=1e-6)


def test_fixed_controller_keeps_value():
    ctrl = FixedKLController(kl_coef=0.05)
    ctrl.update(current_kl=100.0, n_steps=64)
    assert ctrl.value == 0.05


def test_adaptive_controller_by_hand():
    ctrl = AdaptiveKLController(init_kl_coef=0.1, target_kl=6.0, horizon=10000)
    ctrl.update(current_kl=9.0, n_steps=256)  # e = clip(0.5) = 0.2 → ×(1 + 0.2·256/10000)
    assert ctrl.value == pytest.approx(0.1 * 1.00512)
    ctrl = AdaptiveKLController(init_kl_coef=0.1, target_kl=6.0, horizon=10000)
    ctrl.update(current_kl=6.6, n_steps=256)  # e = 0.1 (inside the clip)
    assert ctrl.value == pytest.approx(0.1 * 1.00256)


def test_adaptive_controller_moves_toward_target():
    above = AdaptiveKLController(init_kl_coef=0.1, target_kl=1.0, horizon=100)
    below = AdaptiveKLController(init_kl_coef=0.1, target_kl=1.0, horizon=100)
    previous_above, previous_below = above.value, below.value
    for _ in range(5):
        above.update(current_kl=2.0, n_steps=10)
        below.update(current_kl=0.5, n_steps=10)
        assert above.value > previous_above and below.value < previous_below
        previous_above, previous_below = above.value, below.value


def test_controller_state_round_trip():
    ctrl = AdaptiveKLController(init_kl_coef=0.1, target_kl=1.0, horizon=100)
    ctrl.update(current_kl=3.0, n_steps=50)
    fresh = AdaptiveKLController(init_kl_coef=0.1, target_kl=1.0, horizon=100)
    fresh.load_state_dict(ctrl.state_dict())
    assert fresh.value == ctrl.value != 0.1


def test_get_kl_controller():
    assert isinstance(get_kl_controller(type="fixed", kl_coef=0.01), FixedKLController)
    adaptive = get_kl_controller(type="adaptive", kl_coef=0.01, horizon=10, target_kl=0.1)
    assert isinstance(adaptive, AdaptiveKLController) and adaptive.value == 0.01
    with pytest.raises(ValueError, match="horizon"):
        get_kl_controller(type="adaptive", kl_coef=0.01)
    with pytest.raises(ValueError, match="fixed"):
        get_kl_controller(type="pid", kl_coef=0.01)
    with pytest.raises(ValueError, match="horizon"):
        AdaptiveKLController(init_kl_coef=0.1, target_kl=1.0, horizon=0)


def test_apply_kl_penalty_by_hand():
    scores = torch.tensor([[0.0, 0.0, 1.0], [0.0, 0.0, 0.0]])
    old = torch.full((2, 3), -1.0)
    ref = torch.tensor([[-1.5, -1.0, -0.5], [-2.0, -2.0, -2.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    ctrl = AdaptiveKLController(init_kl_coef=0.1, target_kl=0.25, horizon=10)
    rewards, metrics = apply_kl_penalty(scores, old, ref, mask, ctrl, kl_penalty="kl")
    # kl = ℓ_old − ℓ_ref = [[0.5, 0, −0.5], [1, 1, (masked)]]
    assert rewards.tolist()[0] == pytest.approx([-0.05, 0.0, 1.05])
    assert rewards.tolist()[1] == pytest.approx([-0.1, -0.1, 0.0])
    # per-row masked means 0 and 1 → 0.5; e = clip(0.5/0.25 − 1) = 0.2; β ← 0.1·(1 + 0.2·2/10)
    assert metrics["actor/reward_kl_penalty"] == pytest.approx(0.5)
    assert metrics["actor/reward_kl_penalty_coeff"] == pytest.approx(0.1)
    assert ctrl.value == pytest.approx(0.104)


def test_apply_kl_penalty_rejects_nan_log_probs():
    mask = torch.ones(1, 2)
    with pytest.raises(ValueError, match="ref_log_prob"):
        apply_kl_penalty(
            torch.zeros(1, 2), torch.zeros(1, 2), torch.tensor([[0.0, float("nan")]]), mask, FixedKLController(0.1)
        )


def test_check_kl_penalty_name():
    for name in ("kl", "k3+", "low_var_kl", "mse+"):
        check_kl_penalty_name(name)
    with pytest.raises(ValueError, match="'\\+' suffix"):
        check_kl_penalty_name("k4")


def test_k3_of_a_log_ratio_at_fp32_resolution_is_not_negative():
    # exp(u) − u − 1 rounds to −u for u = −2^-24: found by a property test on a 1-thread run
    for u in (-(2.0**-24), 2.0**-24, -(2.0**-30), 1e-7):
        value = kl_penalty(torch.tensor([u]), torch.tensor([0.0]), "k3").item()
        assert 0.0 <= value <= 1e-13, u
    # and it still equals e^u − u − 1 where that is well-conditioned
    assert kl_penalty(torch.tensor([0.0]), torch.tensor([1.0]), "k3").item() == pytest.approx(math.e - 2, rel=1e-6)
