"""Tolerances for numbers that crossed a process boundary, a thread count, a micro-batch split
or a backend — the one rule every test follows (docs/testing.md, "Numerical comparisons").

Floating-point addition is not associative. The same reduction taken in another order — another
kernel (AVX2 vs AVX-512 vs AMX), another blocking, another number of threads, a sum split over
micro-batches or ranks — differs in its last bits. For a sum of ``n`` terms in a dtype whose unit
roundoff is ``u = eps / 2`` (fp32 ≈ 6.0e-8, bf16 ≈ 3.9e-3), two orders differ by at most
``2·n·u·Σ|x|``; rounding errors behave like independent signs, so the difference is typically
``√n·u·Σ|x|``. :func:`tolerance` takes that typical bound with a safety factor of 4, and grows
linearly with ``depth``, the number of such reductions that feed each other in sequence (layers
of a network, optimizer steps of a run): a first-order error propagates about additively through
well-conditioned steps.

``atol`` is ``rtol · scale``: the differences are relative to the *terms* of the sum, not to the
result, so a sum that cancels to ~0 (a GRPO loss, whose advantages sum to zero; ``ppo_kl`` on
the first step) needs an absolute floor of the size of its terms (``scale``, 1 for quantities of
order one: log-probs, losses, norms of a tiny model).

Bitwise equality (``torch.equal``, ``==`` on floats) is asserted only where the code guarantees it
by construction: the same process, the same kernel, the same order — with a comment saying so.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

SAFETY = 4.0
# The tiny random models of the tests (hybridflow.models.tiny, defaults): the widest sum is the
# MLP's (2 · hidden 128), and a forward + backward pass chains ~8 of them (embedding, 2 layers,
# LM head; twice).
TINY_WIDTH = 256
TINY_DEPTH = 8


@dataclass(frozen=True)
class Tolerance:
    rtol: float
    atol: float


def tolerance(dtype: torch.dtype, reduction_size: int, *, depth: int = 1, scale: float = 1.0) -> Tolerance:
    """``rtol = 4·u·√n·depth``, ``atol = rtol·scale`` for results of ``dtype`` whose longest
    re-orderable sum has ``reduction_size`` terms (tokens of a batch, the width of a matmul, the
    elements of a norm) and which passed ``depth`` such sums in sequence."""
    if reduction_size < 1 or depth < 1:
        raise ValueError(f"reduction_size and depth must be >= 1, got {reduction_size}, {depth}")
    unit_roundoff = torch.finfo(dtype).eps / 2
    rtol = SAFETY * unit_roundoff * math.sqrt(reduction_size) * depth
    return Tolerance(rtol=rtol, atol=rtol * scale)


def assert_close_across(actual: Any, expected: Any, *, dtype: torch.dtype, reduction_size: int, depth: int = 1,
                        scale: float = 1.0, what: str = "value") -> None:
    """Assert ``actual`` ≈ ``expected`` within :func:`tolerance`; recurses into mappings (same
    keys) and sequences (same length). Floats and float tensors are compared with the tolerance;
    ints, bools, strings and integer tensors (token ids, counts) must be equal."""
    tol = tolerance(dtype, reduction_size, depth=depth, scale=scale)
    _compare(actual, expected, tol, what)


def _compare(actual: Any, expected: Any, tol: Tolerance, where: str) -> None:
    if isinstance(expected, Mapping):
        assert isinstance(actual, Mapping), f"{where}: expected a mapping, got {type(actual).__name__}"
        assert actual.keys() == expected.keys(), (
            f"{where}: keys differ: only in actual {sorted(actual.keys() - expected.keys())}, "
            f"only in expected {sorted(expected.keys() - actual.keys())}")
        for key in expected:
            _compare(actual[key], expected[key], tol, f"{where}[{key!r}]")
    elif isinstance(expected, torch.Tensor):
        assert isinstance(actual, torch.Tensor), f"{where}: expected a tensor, got {type(actual).__name__}"
        if expected.is_floating_point():
            torch.testing.assert_close(actual, expected, rtol=tol.rtol, atol=tol.atol, msg=lambda m: f"{where}: {m}")
        else:
            assert torch.equal(actual, expected), f"{where}: integer tensors differ"
    elif isinstance(expected, float) and not isinstance(actual, str):
        if math.isnan(expected):
            assert math.isnan(actual), f"{where}: {actual} vs nan"
            return
        assert math.isclose(actual, expected, rel_tol=tol.rtol, abs_tol=tol.atol), (
            f"{where}: {actual!r} vs {expected!r} (|diff| {abs(actual - expected):.3g} > "
            f"rtol {tol.rtol:.3g} · |expected| + atol {tol.atol:.3g})")
    elif isinstance(expected, Sequence) and not isinstance(expected, str):
        assert isinstance(actual, Sequence) and len(actual) == len(expected), (
            f"{where}: lengths differ ({len(actual) if isinstance(actual, Sequence) else type(actual).__name__}"
            f" vs {len(expected)})")
        for i, (a, e) in enumerate(zip(actual, expected, strict=True)):
            _compare(a, e, tol, f"{where}[{i}]")
    else:
        assert actual == expected, f"{where}: {actual!r} != {expected!r}"


def assert_greedy_tokens_match(actual: torch.Tensor, expected: torch.Tensor, expected_logits: torch.Tensor, *,
                               dtype: torch.dtype, reduction_size: int, depth: int = 1,
                               what: str = "greedy tokens") -> None:
    """Greedy tokens of two backends ([B, T] each; ``expected_logits`` [B, T, V] the reference's
    logits at each step). A row may part from the reference only at a step where the token
    ``actual`` chose scores within :func:`tolerance` of the reference's best (scaled by the
    largest logit): a near tie that another kernel order can break either way. From that step on
    the two continue from different texts, so the row is compared up to it only."""
    assert actual.shape == expected.shape, f"{what}: shapes {tuple(actual.shape)} vs {tuple(expected.shape)}"
    tol = tolerance(dtype, reduction_size, depth=depth)
    for row in range(actual.shape[0]):
        differ = (actual[row] != expected[row]).nonzero()
        if differ.numel() == 0:
            continue
        step = int(differ[0, 0])
        logits = expected_logits[row, step].float()
        gap = float(logits.max() - logits[int(actual[row, step])])
        bound = tol.rtol * float(logits.abs().max()) + tol.atol
        assert gap <= bound, (
            f"{what}: row {row} parts from the reference at step {step} (token {int(actual[row, step])} vs "
            f"{int(expected[row, step])}), whose logit is {gap:.3g} below the best: not a near tie (bound {bound:.3g})")
