"""Learning-rate schedules: warm-up, constant, cosine — hand-computed factors."""

from __future__ import annotations

import math

import pytest

from hybridflow.engine.schedules import LR_SCHEDULES, build_lr_lambda, resolve_warmup_steps


def test_constant_with_warmup() -> None:
    f = build_lr_lambda("constant", warmup_steps=4, total_steps=None)
    assert [f(s) for s in range(6)] == [0.0, 0.25, 0.5, 0.75, 1.0, 1.0]


def test_constant_without_warmup_is_one() -> None:
    f = build_lr_lambda("constant", warmup_steps=0, total_steps=None)
    assert f(0) == 1.0 and f(100) == 1.0


def test_cosine_hand_values() -> None:
    f = build_lr_lambda("cosine", warmup_steps=2, total_steps=12, min_lr_ratio=0.1)
    assert f(1) == 0.5
    assert f(2) == pytest.approx(1.0)
    # p = (7 - 2) / 10 = 0.5 → cos(π/2) = 0 → 0.1 + 0.9 · 0.5
    assert f(7) == pytest.approx(0.55)
    assert f(12) == pytest.approx(0.1)
    assert f(4) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.2)))


def test_warmup_steps_resolution() -> None:
    assert resolve_warmup_steps(3, 0.5, 100) == 3  # explicit steps win
    assert resolve_warmup_steps(0, 0.25, 10) == 2  # int(0.25 · 10)
    assert resolve_warmup_steps(-1, 0.0, None) == 0
    with pytest.raises(ValueError, match="needs the total number of training steps"):
        resolve_warmup_steps(0, 0.1, None)


def test_errors() -> None:
    with pytest.raises(ValueError, match="unknown lr scheduler type 'linear'; valid names: constant, cosine"):
        build_lr_lambda("linear", 0, 10)
    with pytest.raises(ValueError, match="cosine lr schedule needs total training steps"):
        build_lr_lambda("cosine", 0, None)
    assert LR_SCHEDULES.names() == ["constant", "cosine"]
