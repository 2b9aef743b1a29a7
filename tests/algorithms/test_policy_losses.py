"""Policy losses against hand-computed numbers, plus PPO's clipping properties."""

import math

import pytest
import torch

from hybridflow.algorithms.policy_losses import (
    POLICY_LOSSES,
    compute_policy_loss_cispo,
    compute_policy_loss_clip_cov,
    compute_policy_loss_dppo_kl,
    compute_policy_loss_dppo_tv,
    compute_policy_loss_dro,
    compute_policy_loss_geo_mean,
    compute_policy_loss_gpg,
    compute_policy_loss_gspo,
    compute_policy_loss_kl_cov,
    compute_policy_loss_sapo,
    compute_policy_loss_vanilla,
    get_policy_loss_fn,
    get_policy_loss_spec,
    register_policy_loss,
    select_policy_loss_params,
)

STANDARD_METRICS = {"actor/pg_clipfrac", "actor/ppo_kl", "actor/pg_clipfrac_lower"}
ALL_SCALARS = {
    "clip_ratio_low": 0.2,
    "clip_ratio_high": 0.28,
    "clip_ratio_c": 3.0,
    "tau_pos": 1.0,
    "tau_neg": 1.05,
    "clip_cov_ratio": 0.2,
    "clip_cov_lb": 0.0,
    "clip_cov_ub": 5.0,
    "kl_cov_ratio": 0.2,
    "ppo_kl_coef": 0.1,
    "dro_beta": 0.1,
    "loss_type": "ppo_clip",
    "rollout_is": "token",
}


def _logs(*ratios):
    return torch.tensor([[math.log(r) for r in ratios]])


# --- registry / calling convention ---------------------------------------------------------


EXPECTED = {"vanilla", "gspo", "sapo", "gpg", "clip_cov", "kl_cov", "geo_mean", "cispo",
            "dppo_tv", "dppo_kl", "dro", "bypass_mode"}  # fmt: skip


def test_all_losses_registered_and_unknown_name_lists_them():
    assert EXPECTED <= set(POLICY_LOSSES.names())
    with pytest.raises(ValueError, match="vanilla"):
        get_policy_loss_fn("Vanilla")


def test_registering_a_different_function_under_a_taken_name_fails():
    def impostor(*args, **kwargs):
        raise AssertionError

    with pytest.raises(ValueError, match="already registered"):
        register_policy_loss("vanilla")(impostor)
    assert get_policy_loss_fn("vanilla") is compute_policy_loss_vanilla


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_uniform_call_returns_scalar_and_detached_standard_metrics(name):
    g = torch.Generator().manual_seed(0)
    old = -torch.rand(4, 5, generator=g) * 2
    logp = (old + 0.2 * torch.randn(4, 5, generator=g)).requires_grad_()
    adv = torch.randn(4, 5, generator=g)
    mask = torch.ones(4, 5)
    mask[1, 3:] = 0
    fn = get_policy_loss_fn(name)
    params = select_policy_loss_params(name, ALL_SCALARS)
    assert set(params) <= set(get_policy_loss_spec(name).params)
    loss, metrics = fn(old, logp, adv, mask, "token-mean", **params, rollout_is_weights=None, global_batch_info=None)
    assert loss.dim() == 0 and torch.isfinite(loss)
    assert STANDARD_METRICS <= set(metrics)
    assert all(isinstance(v, torch.Tensor) and not v.requires_grad for v in metrics.values())
    loss.backward()
    assert torch.isfinite(logp.grad).all()


@pytest.mark.parametrize("name", sorted(EXPECTED - {"bypass_mode"}))
def test_rollout_is_weights_multiply_per_token_losses(name):
    g = torch.Generator().manual_seed(1)
    old = -torch.rand(3, 4, generator=g)
    logp = old + 0.05 * torch.randn(3, 4, generator=g)
    adv = torch.randn(3, 4, generator=g)
    mask = torch.ones(3, 4)
    fn, params = get_policy_loss_fn(name), select_policy_loss_params(name, ALL_SCALARS)
    torch.manual_seed(0)
    base, _ = fn(old, logp, adv, mask, "token-sum", **params)
    torch.manual_seed(0)
    doubled, _ = fn(old, logp, adv, mask, "token-sum", **params, rollout_is_weights=torch.full((3, 4), 2.0))
    assert doubled.item() == pytest.approx(2 * base.item(), rel=1e-5, abs=1e-7)


# --- vanilla PPO ---------------------------------------------------------------------------


def test_vanilla_by_hand():
    # tokens: (A, ρ) = (1, 1.5) clipped to 1.2; (1, 0.5) unclipped; (−1, 0.5) clipped to 0.8;
    # (−1, 5) dual-clipped to c = 3; (−1, 1.1) inside
    logp = _logs(1.5, 0.5, 0.5, 5.0, 1.1)
    adv = torch.tensor([[1.0, 1.0, -1.0, -1.0, -1.0]])
    loss, metrics = compute_policy_loss_vanilla(torch.zeros(1, 5), logp, adv, torch.ones(1, 5))
    assert loss.item() == pytest.approx((-1.2 - 0.5 + 0.8 + 3.0 + 1.1) / 5, rel=1e-6)  # 0.64
    assert metrics["actor/pg_clipfrac"].item() == pytest.approx(0.4)
    assert metrics["actor/pg_clipfrac_lower"].item() == pytest.approx(0.2)
    ppo_kl = -sum(math.log(r) for r in (1.5, 0.5, 0.5, 5.0, 1.1)) / 5  # −0.144784
    assert metrics["actor/ppo_kl"].item() == pytest.approx(ppo_kl, rel=1e-5)


@pytest.mark.parametrize(
    ("advantage", "ratio", "clipped"),
    [(1.0, 1.27, False), (1.0, 1.29, True), (1.0, 0.5, False), (-1.0, 0.81, False), (-1.0, 0.79, True),
     (-1.0, 2.5, False), (-1.0, 3.2, True)],
)  # fmt: skip
def test_clipping_engages_exactly_outside_the_band(advantage, ratio, clipped):
    # ε_low = 0.2, ε_high = 0.28: the gradient vanishes exactly when the clip (or dual clip) is active
    logp = _logs(ratio).requires_grad_()
    loss, metrics = compute_policy_loss_vanilla(
        torch.zeros(1, 1), logp, torch.tensor([[advantage]]), torch.ones(1, 1), clip_ratio_high=0.28
    )
    loss.backward()
    assert (logp.grad.abs().item() == 0.0) is clipped
    if ratio < 3.0:  # the dual-clip region counts in pg_clipfrac_lower instead
        assert metrics["actor/pg_clipfrac"].item() == float(clipped)


def test_larger_advantage_lowers_the_loss():
    g = torch.Generator().manual_seed(2)
    logp = torch.randn(64, 1, generator=g) * 0.5
    adv = torch.randn(64, 1, generator=g)
    mask = torch.ones(1, 1)
    for i in range(64):
        lower, _ = compute_policy_loss_vanilla(torch.zeros(1, 1), logp[i : i + 1], adv[i : i + 1], mask)
        higher, _ = compute_policy_loss_vanilla(torch.zeros(1, 1), logp[i : i + 1], adv[i : i + 1] + 0.3, mask)
        assert higher.item() < lower.item()


def test_dual_clip_bounds_the_loss_for_negative_advantages():
    g = torch.Generator().manual_seed(3)
    logp = torch.rand(1, 200, generator=g) * 6  # ρ up to e^6
    adv = -torch.rand(1, 200, generator=g) * 2
    loss, _ = compute_policy_loss_vanilla(torch.zeros(1, 200), logp, adv, torch.ones(1, 200), "token-sum")
    per_token_bound = (-adv * 3.0).sum()
    assert loss.item() <= per_token_bound.item() + 1e-5
    one, _ = compute_policy_loss_vanilla(torch.zeros(1, 1), _logs(50.0), torch.tensor([[-2.0]]), torch.ones(1, 1))
    assert one.item() == pytest.approx(6.0)


def test_vanilla_rejects_bad_dual_clip():
    with pytest.raises(ValueError, match="clip_ratio_c"):
        compute_policy_loss_vanilla(torch.zeros(1, 1), torch.zeros(1, 1), torch.ones(1, 1), torch.ones(1, 1),
                                    clip_ratio_c=1.0)  # fmt: skip


# --- other losses by hand ------------------------------------------------------------------


def test_gspo_by_hand():
    old = torch.zeros(1, 2)
    logp = _logs(1.2, 1.0).requires_grad_()
    adv = torch.ones(1, 2)
    # ŝ = ln(1.2)/2 → r = √1.2 = 1.095445 on both tokens; ε = 0.2 keeps it unclipped
    loss, metrics = compute_policy_loss_gspo(old, logp, adv, torch.ones(1, 2))
    assert loss.item() == pytest.approx(-math.sqrt(1.2), rel=1e-6)
    loss.backward()
    assert logp.grad[0].tolist() == pytest.approx([-math.sqrt(1.2) / 2] * 2, rel=1e-6)
    assert metrics["actor/pg_clipfrac"].item() == 0.0
    clipped, metrics = compute_policy_loss_gspo(old, logp, adv, torch.ones(1, 2), clip_ratio_low=0.05,
                                                clip_ratio_high=0.05)  # fmt: skip
    assert clipped.item() == pytest.approx(-1.05, rel=1e-6)
    assert metrics["actor/pg_clipfrac"].item() == 1.0


def test_gspo_always_aggregates_seq_mean_token_mean():
    old, logp = torch.zeros(2, 3), torch.zeros(2, 3)
    adv = torch.tensor([[1.0, 1.0, 1.0], [4.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    for mode in ("token-mean", "seq-mean-token-sum"):
        loss, _ = compute_policy_loss_gspo(old, logp, adv, mask, mode)
        assert loss.item() == pytest.approx(-(1.0 + 4.0) / 2)


def test_sapo_by_hand():
    old = torch.zeros(1, 2)
    adv = torch.tensor([[1.0, -1.0]])
    # ρ = 1: gate = σ(0)·4/τ = 2/τ → −2 (τ_pos = 1) and +2/1.05 (τ_neg = 1.05)
    loss, metrics = compute_policy_loss_sapo(old, torch.zeros(1, 2), adv, torch.ones(1, 2))
    assert loss.item() == pytest.approx((-2.0 + 2 / 1.05) / 2, abs=1e-6)
    assert metrics["actor/pg_clipfrac"].item() == 0.0
    loss, _ = compute_policy_loss_sapo(torch.zeros(1, 1), _logs(2.0), torch.ones(1, 1), torch.ones(1, 1))
    assert loss.item() == pytest.approx(-4 / (1 + math.exp(-1)), rel=1e-6)  # −σ(1)·4 = −2.924234


def test_gpg_by_hand():
    logp = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    loss, _ = compute_policy_loss_gpg(torch.zeros(1, 2), logp, torch.tensor([[1.0, 2.0]]), torch.ones(1, 2))
    assert loss.item() == pytest.approx(2.5)
    loss.backward()
    assert logp.grad[0].tolist() == pytest.approx([-0.5, -1.0])


def test_cispo_by_hand():
    logp = _logs(1.5, 0.5).requires_grad_()
    loss, metrics = compute_policy_loss_cispo(torch.zeros(1, 2), logp, torch.ones(1, 2), torch.ones(1, 2))
    # −sg(clip(ρ))·A·ℓ = −1.2·ln 1.5, −0.8·ln 0.5
    assert loss.item() == pytest.approx((-1.2 * math.log(1.5) - 0.8 * math.log(0.5)) / 2, rel=1e-6)
    loss.backward()
    assert logp.grad[0].tolist() == pytest.approx([-0.6, -0.4], rel=1e-6)  # every token keeps a gradient
    assert metrics["actor/pg_clipfrac"].item() == 1.0


def test_dro_by_hand():
    logp = torch.tensor([[-1.0, -0.5]])
    adv = torch.tensor([[1.0, -1.0]])
    loss, _ = compute_policy_loss_dro(torch.zeros(1, 2), logp, adv, torch.ones(1, 2), dro_beta=0.1)
    # −(ℓA − 0.05 d²): 1.05 and −0.4875
    assert loss.item() == pytest.approx((1.05 - 0.4875) / 2)
    with pytest.raises(ValueError, match="dro_beta"):
        compute_policy_loss_dro(torch.zeros(1, 2), logp, adv, torch.ones(1, 2), dro_beta=0.0)


def test_geo_mean_by_hand():
    old = torch.zeros(2, 2)
    logp = torch.tensor([[0.1, 0.5], [-0.5, 0.1]])
    adv = torch.tensor([[1.0, 1.0], [-1.0, -1.0]])
    loss, metrics = compute_policy_loss_geo_mean(old, logp, adv, torch.ones(2, 2), clip_ratio_high=0.28)
    # row 0 (A > 0): d* = [0.1, 0.28] → R = e^0.19; row 1 (A < 0): d* = [−0.2, 0.1] → R = e^−0.05
    assert loss.item() == pytest.approx((-math.exp(0.19) + math.exp(-0.05)) / 2, rel=1e-6)
    assert metrics["actor/pg_clipfrac"].item() == pytest.approx(0.25)
    assert metrics["actor/pg_clipfrac_lower"].item() == pytest.approx(0.25)


def test_kl_cov_by_hand():
    logp = torch.tensor([[0.5, -1.0, -1.0, -2.0]])
    adv = torch.tensor([[1.0, 0.0, 0.0, -1.0]])
    # cov = (A − 0)(ℓ + 0.875) = [1.375, 0, 0, 1.125] → k = 1 picks token 0
    loss, metrics = compute_policy_loss_kl_cov(torch.zeros(1, 4), logp, adv, torch.ones(1, 4), kl_cov_ratio=0.25)
    expected = (-math.exp(0.5) + 0.1 * 0.5 + math.exp(-2.0)) / 4
    assert loss.item() == pytest.approx(expected, rel=1e-6)
    assert metrics["actor/ppo_kl"].item() == pytest.approx((0.5 + 1 + 1 + 2) / 4)


CLIP_COV = {"old": torch.zeros(1, 4), "logp": torch.tensor([[0.1, 0.0, 0.0, -0.1]]),
            "adv": torch.tensor([[2.0, 0.0, 0.0, -2.0]]), "mask": torch.ones(1, 4)}  # fmt: skip
# cov = [0.2, 0, 0, 0.2]: tokens 0 and 3 are candidates; k = max(⌊0.25·4⌋, 1) = 1
LOSS_T0, LOSS_T3 = -2 * math.exp(0.1), 2 * math.exp(-0.1)


def _clip_cov(seed, lb=0.1):
    c = CLIP_COV
    return compute_policy_loss_clip_cov(
        c["old"], c["logp"], c["adv"], c["mask"], clip_cov_ratio=0.25, clip_cov_lb=lb,
        generator=torch.Generator().manual_seed(seed),
    )  # fmt: skip


def test_clip_cov_zeroes_one_random_candidate_reproducibly():
    outcomes = set()
    for seed in range(16):
        loss, metrics = _clip_cov(seed)
        assert loss.item() in (pytest.approx(LOSS_T3 / 4), pytest.approx(LOSS_T0 / 4))
        assert metrics["actor/pg_clipfrac"].item() == pytest.approx(0.25)
        assert _clip_cov(seed)[0].item() == loss.item()
        outcomes.add(round(loss.item(), 6))
    assert len(outcomes) == 2


def test_clip_cov_without_candidates_is_plain_clip():
    loss, metrics = _clip_cov(0, lb=0.3)
    assert loss.item() == pytest.approx((LOSS_T0 + LOSS_T3) / 4, rel=1e-6)
    assert metrics["actor/pg_clipfrac"].item() == 0.0


def _probs(*p):
    return torch.tensor([[math.log(x) for x in p]])


def test_dppo_tv_by_hand():
    old = _probs(0.5, 0.5, 0.5, 0.5)
    logp = _probs(0.6, 0.8, 0.4, 0.2).requires_grad_()
    adv = torch.tensor([[1.0, 1.0, -1.0, -1.0]])
    # Δp = 0.1 keep, 0.3 > 0.2 drop, −0.1 keep, −0.3 < −0.2 drop; w = ρ = 1.2, 1.6, 0.8, 0.4
    loss, metrics = compute_policy_loss_dppo_tv(old, logp, adv, torch.ones(1, 4))
    assert loss.item() == pytest.approx((-1.2 * math.log(0.6) + 0.8 * math.log(0.4)) / 4, rel=1e-6)
    assert metrics["actor/pg_clipfrac"].item() == 0.5
    assert metrics["actor/pg_clipfrac_lower"].item() == 0.0
    loss.backward()
    assert logp.grad[0].tolist() == pytest.approx([-1.2 / 4, 0.0, 0.8 / 4, 0.0], rel=1e-5)
    truncated, metrics = compute_policy_loss_dppo_tv(old, logp, adv, torch.ones(1, 4), clip_ratio_c=1.1)
    assert truncated.item() == pytest.approx((-1.1 * math.log(0.6) + 0.8 * math.log(0.4)) / 4, rel=1e-6)
    assert metrics["actor/pg_clipfrac_lower"].item() == 0.25


def test_dppo_kl_by_hand():
    old = _probs(0.5, 0.5, 0.5, 0.5)
    logp = _probs(0.8, 0.2, 0.2, 0.8)
    adv = torch.tensor([[1.0, 1.0, -1.0, -1.0]])
    # binary KL 0.2231 > 0.2 everywhere: keep only moves against the advantage's push direction
    loss, metrics = compute_policy_loss_dppo_kl(old, logp, adv, torch.ones(1, 4))
    assert loss.item() == pytest.approx((-0.4 * math.log(0.2) + 1.6 * math.log(0.8)) / 4, rel=1e-5)
    assert metrics["actor/pg_clipfrac"].item() == 0.5
    loose, metrics = compute_policy_loss_dppo_kl(old, logp, adv, torch.ones(1, 4), clip_ratio_low=0.25,
                                                 clip_ratio_high=0.25)  # fmt: skip
    assert metrics["actor/pg_clipfrac"].item() == 0.0
