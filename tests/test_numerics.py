"""The shared tolerance of tests/numerics.py: its values by hand, a re-ordered fp32 sum passes, a
real difference fails, and non-float values stay exact."""

from __future__ import annotations

import math

import pytest
import torch

from tests.numerics import assert_close_across, assert_greedy_tokens_match, tolerance


def test_tolerance_by_hand():
    # fp32: u = 2^-24; 4 · 2^-24 · √256 · 2 = 2^2 · 2^-24 · 2^4 · 2^1 = 2^-17
    tol = tolerance(torch.float32, 256, depth=2)
    assert tol.rtol == 2.0**-17 and tol.atol == 2.0**-17
    # bf16: u = 2^-8; 4 · 2^-8 · √4 = 2^-5, atol scaled by 10
    tol = tolerance(torch.bfloat16, 4, scale=10.0)
    assert tol.rtol == 2.0**-5 and tol.atol == 10 * 2.0**-5
    with pytest.raises(ValueError, match="reduction_size and depth"):
        tolerance(torch.float32, 0)


def test_a_reordered_fp32_sum_passes_and_a_real_difference_fails():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(4096, generator=gen)
    forward = float(torch.cumsum(x, 0)[-1])  # one order
    blocked = float(x.view(64, 64).sum(1).flip(0).sum())  # another
    assert forward != blocked  # the orders really differ in the last bits
    assert_close_across(blocked, forward, dtype=torch.float32, reduction_size=4096, scale=float(x.abs().sum()))
    with pytest.raises(AssertionError, match="vs"):
        assert_close_across(forward * (1 + 1e-3), forward, dtype=torch.float32, reduction_size=4096)


def test_structures_recurse_and_non_floats_are_exact():
    expected = {"step": 3, "loss": 0.5, "ids": torch.tensor([1, 2]), "curve": [1.0, 2.0], "name": "a"}
    assert_close_across({**expected, "loss": 0.5 + 1e-9}, expected, dtype=torch.float32, reduction_size=1)
    for wrong, match in (({**expected, "step": 4}, "step"), ({**expected, "ids": torch.tensor([1, 3])}, "ids"),
                         ({**expected, "curve": [1.0]}, "lengths"), ({"step": 3}, "keys differ"),
                         ({**expected, "name": "b"}, "name")):
        with pytest.raises(AssertionError, match=match):
            assert_close_across(wrong, expected, dtype=torch.float32, reduction_size=1)
    assert_close_across(math.nan, math.nan, dtype=torch.float32, reduction_size=1)
    with pytest.raises(AssertionError):
        assert_close_across(torch.ones(3) * 1.01, torch.ones(3), dtype=torch.float32, reduction_size=64)


def test_greedy_tokens_may_part_only_at_a_near_tie():
    expected = torch.tensor([[5, 6, 7], [1, 2, 3]])
    logits = torch.zeros(2, 3, 10)
    logits[0, 1, 6], logits[0, 1, 9] = 10.0, 10.0 - 1e-6  # row 0, step 1: tokens 6 and 9 nearly tie
    logits[1, 0, 1], logits[1, 0, 4] = 10.0, 9.0  # row 1, step 0: token 1 clearly best
    for row, step, token in ((0, 0, 5), (0, 1, 6), (0, 2, 7), (1, 0, 1), (1, 1, 2), (1, 2, 3)):
        logits[row, step, token] = max(float(logits[row, step, token]), 10.0)
    near_tie = torch.tensor([[5, 9, 0], [1, 2, 3]])  # parts at the tie; what follows is not compared
    assert_greedy_tokens_match(near_tie, expected, logits, dtype=torch.float32, reduction_size=256, depth=8)
    assert_greedy_tokens_match(expected.clone(), expected, logits, dtype=torch.float32, reduction_size=1)
    with pytest.raises(AssertionError, match="row 1 parts from the reference at step 0"):
        assert_greedy_tokens_match(torch.tensor([[5, 6, 7], [4, 2, 3]]), expected, logits, dtype=torch.float32,
                                   reduction_size=256, depth=8)
