"""Distillation divergences against hand-computed numbers and brute force over the vocabulary."""

from __future__ import annotations

import math

import pytest
import torch

from hybridflow.algorithms.distillation import (
    DISTILLATION_LOSSES,
    fold_distillation_advantage,
    forward_kl_topk,
    jsd_topk,
    sampled_token_divergence,
    topk_divergence,
    topk_mass,
    uses_topk,
)
from hybridflow.algorithms.kl import kl_penalty


def _log_softmax(shape, seed, scale=2.0):
    g = torch.Generator().manual_seed(seed)
    return torch.log_softmax(torch.randn(*shape, generator=g) * scale, dim=-1)


def test_forward_kl_with_k_equal_to_the_vocabulary_is_the_full_kl():
    teacher, student = _log_softmax((3, 4, 50), 0), _log_softmax((3, 4, 50), 1)
    brute = (teacher.exp() * (teacher - student)).sum(-1)  # KL(p_T ‖ q_S) over all 50 tokens
    # K = V in the teacher's own order (sorted descending, as a top-K returns them), student gathered there
    values, ids = teacher.topk(50, dim=-1)
    got = forward_kl_topk(student.gather(-1, ids), values)
    torch.testing.assert_close(got, brute, rtol=1e-5, atol=1e-6)


def test_forward_kl_topk_by_hand():
    # teacher top-2 probabilities 0.6, 0.2 → renormalised 0.75, 0.25; student 0.5, 0.1 there
    teacher = torch.log(torch.tensor([[[0.6, 0.2]]]))
    student = torch.log(torch.tensor([[[0.5, 0.1]]]))
    expected = 0.75 * math.log(0.75 / 0.5) + 0.25 * math.log(0.25 / 0.1)
    assert forward_kl_topk(student, teacher).item() == pytest.approx(expected, rel=1e-6)
    assert topk_mass(teacher).item() == pytest.approx(0.8, rel=1e-6)
    # zero exactly when the student puts the teacher's renormalised mass on the ids
    assert forward_kl_topk(torch.log(torch.tensor([[[0.75, 0.25]]])), teacher).item() == pytest.approx(0, abs=1e-7)


def test_jsd_with_k_equal_to_the_vocabulary_is_the_full_generalised_jsd():
    teacher, student = _log_softmax((2, 3, 40), 2), _log_softmax((2, 3, 40), 3)
    for beta in (0.1, 0.5, 0.9):
        p, q = teacher.exp(), student.exp()
        m = beta * p + (1 - beta) * q
        brute = beta * (p * (p / m).log()).sum(-1) + (1 - beta) * (q * (q / m).log()).sum(-1)
        values, ids = teacher.topk(40, dim=-1)
        got = jsd_topk(student.gather(-1, ids), values, jsd_beta=beta)
        torch.testing.assert_close(got, brute, rtol=1e-5, atol=1e-6)
    # β = 0.5 is symmetric, and bounded by log 2
    sym = jsd_topk(student, teacher, 0.5)
    torch.testing.assert_close(sym, jsd_topk(teacher, student, 0.5))
    assert (sym >= 0).all() and (sym <= math.log(2) + 1e-6).all()
    with pytest.raises(ValueError, match="jsd_beta"):
        jsd_topk(student, teacher, 1.0)


def test_a_teacher_with_zero_probabilities_gives_finite_losses():
    teacher = torch.tensor([[[0.0, -float("inf")]]])
    student = torch.log(torch.tensor([[[0.5, 0.25]]]))
    assert forward_kl_topk(student, teacher).item() == pytest.approx(math.log(2), rel=1e-6)
    assert math.isfinite(jsd_topk(student, teacher).item())


def test_estimator_losses_are_the_kl_estimators_on_the_sampled_token():
    g = torch.Generator().manual_seed(4)
    s, t = -torch.rand(4, 6, generator=g) * 3, -torch.rand(4, 6, generator=g) * 3
    for name in ("k1", "k2", "k3", "low_var_kl", "abs"):
        assert not uses_topk(name)
        torch.testing.assert_close(sampled_token_divergence(s, t, name), kl_penalty(s, t, name))
    assert uses_topk("forward_kl_topk") and uses_topk("jsd_topk")
    assert set(DISTILLATION_LOSSES.names()) >= {"k1", "k3", "low_var_kl", "forward_kl_topk", "jsd_topk"}
    with pytest.raises(ValueError, match="needs the teacher's top-K"):
        sampled_token_divergence(s, t, "forward_kl_topk")
    with pytest.raises(ValueError, match="not a top-K loss"):
        topk_divergence("k3", s[..., None], t[..., None])


def test_clamps():
    s = torch.tensor([[-30.0, -1.0]])
    t = torch.tensor([[-1.0, -40.0]])
    # log-probs clamped at −10 first: k1 = (−10 − (−1), −1 − (−10)) = (−9, 9)
    assert sampled_token_divergence(s, t, "k1", log_prob_min_clamp=-10.0).tolist() == [[-9.0, 9.0]]
    assert sampled_token_divergence(s, t, "k1", loss_max_clamp=5.0).tolist() == [[-5.0, 5.0]]
    big = torch.log(torch.tensor([[[0.999, 1e-30]]]))
    assert topk_divergence("forward_kl_topk", big.flip(-1), big, loss_max_clamp=3.0).item() == 3.0


def test_fold_adds_the_teachers_per_token_reward_and_respects_the_mask():
    adv = torch.tensor([[1.0, 1.0, 1.0], [-2.0, -2.0, 0.0]])
    old = torch.log(torch.tensor([[0.5, 0.25, 0.5], [0.1, 0.2, 0.3]]))
    teacher = torch.log(torch.tensor([[0.25, 0.25, 0.9], [0.4, 0.2, 0.3]]))
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])  # agent-loop hole at (1, 1), padding after
    got = fold_distillation_advantage(adv, old, teacher, mask, "k1", reward_weight=0.5, coef=2.0)
    # A = 0.5·A_task − 2·(ℓ_old − ℓ_T) on mask, 0 elsewhere
    expected = torch.tensor([[0.5 - 2 * math.log(2), 0.5, 0.0], [-1.0 + 2 * math.log(4), 0.0, 0.0]])
    torch.testing.assert_close(got, expected)
    # a teacher equal to the sampling policy adds nothing
    torch.testing.assert_close(fold_distillation_advantage(adv, old, old, mask, "k1", 1.0, 3.0), adv * mask)
    # the fold carries no gradient into the student's log-probs
    leaf = old.clone().requires_grad_(True)
    assert not fold_distillation_advantage(adv, leaf, teacher, mask, "k3", 1.0, 1.0).requires_grad
