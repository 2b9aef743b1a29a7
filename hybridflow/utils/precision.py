"""Which compute dtype the hardware runs fast: the ``dtype: auto`` rule.

bf16 halves memory traffic and, where the hardware has a bf16 matmul, runs 3–4× the fp32
FLOP rate on a CPU. Where it has none (AVX2-only CPUs: most laptops), torch falls back to a
reference kernel that runs a bf16 matmul ~100–450× *slower* than fp32. So ``auto`` picks bf16
only where both tell the same story:

* the CPU flags name a native bf16 matmul (``avx512_bf16`` or ``amx_bf16`` on x86, ``bf16`` on
  ARM) — or cannot be read (not Linux), and
* a probe of a few milliseconds (256² matmuls, bf16 vs fp32, after a warm-up) measures bf16
  faster than fp32. The probe catches a flag the torch build cannot use (or a library capped
  below the CPU's ISA, e.g. ``ONEDNN_MAX_CPU_ISA=AVX2``).

On CUDA, bf16 iff ``torch.cuda.is_bf16_supported()``; elsewhere fp32.

:func:`resolve_compute_dtype` is what callers use: it maps ``auto``/``fp32``/``bf16`` to
``fp32``/``bf16``, prints the decision once per process and device kind
(``compute dtype: fp32 (no native bf16 on this CPU: ...)``), and warns once when an explicit
``bf16`` will be slow. :func:`choose_compute_dtype` is the pure decision, tested with faked
flags and probe results.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from functools import cache, lru_cache

import torch

from hybridflow.utils.cpu import cpu_flags

COMPUTE_DTYPES: tuple[str, ...] = ("auto", "fp32", "bf16")
# Flags that mean a native bf16 dot product / matmul unit.
BF16_FLAGS: tuple[str, ...] = ("avx512_bf16", "amx_bf16", "bf16")
PROBE_SIZE = 256
MIN_BF16_SPEEDUP = 1.0  # bf16 must beat fp32 outright; measured 3.7× (avx512_bf16) vs 0.02× (AVX2)


@dataclass(frozen=True)
class MatmulProbe:
    """Measured throughput of a square matmul, GFLOP/s."""

    fp32_gflops: float
    bf16_gflops: float

    @property
    def bf16_speedup(self) -> float:
        return self.bf16_gflops / self.fp32_gflops if self.fp32_gflops > 0 else 0.0

    def describe(self) -> str:
        return f"bf16 matmul {self.bf16_gflops:.3g} vs fp32 {self.fp32_gflops:.3g} GFLOP/s"


@dataclass(frozen=True)
class DtypeChoice:
    """``dtype`` (fp32 or bf16) for a request, why, and a warning when the request will be slow."""

    dtype: str
    reason: str
    warning: str | None = None

    def line(self) -> str:
        return f"compute dtype: {self.dtype} ({self.reason})"


def _gflops(dtype: torch.dtype, size: int, repeats: int) -> float:
    a = torch.randn(size, size).to(dtype)
    b = torch.randn(size, size).to(dtype)
    a @ b  # warm-up: kernel selection, first-touch of scratch memory
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - start)
    return 2 * size**3 / max(best, 1e-9) / 1e9


def probe_matmul(size: int = PROBE_SIZE, repeats: int = 2) -> MatmulProbe:
    """fp32 and bf16 matmul throughput on the CPU (~40 ms where bf16 is emulated, ~5 ms else)."""
    return MatmulProbe(
        fp32_gflops=_gflops(torch.float32, size, repeats), bf16_gflops=_gflops(torch.bfloat16, size, repeats)
    )


def choose_compute_dtype(
    requested: str,
    device_type: str = "cpu",
    *,
    flags: frozenset[str] | None = None,
    probe: MatmulProbe | None = None,
    cuda_bf16: bool = False,
) -> DtypeChoice:
    """The decision of the module docstring, from given facts (no measuring here).

    ``flags``: the CPU flags (None: unknown); ``probe``: the measured matmul rates (needed for
    ``device_type="cpu"`` unless ``requested="fp32"``); ``cuda_bf16``: the GPU supports bf16.
    """
    if requested not in COMPUTE_DTYPES:
        raise ValueError(f"unknown compute dtype {requested!r}; valid: {', '.join(COMPUTE_DTYPES)}")
    if requested == "fp32":
        return DtypeChoice("fp32", "requested")
    if device_type == "cuda":
        if requested == "bf16":
            warning = (
                None if cuda_bf16 else "dtype=bf16 requested but this GPU has no bf16 support; it will be slow or fail"
            )
            return DtypeChoice("bf16", "requested", warning)
        return DtypeChoice("bf16", "the GPU supports bf16") if cuda_bf16 else DtypeChoice("fp32", "the GPU has no bf16")
    if device_type != "cpu":
        return DtypeChoice("bf16", "requested") if requested == "bf16" else DtypeChoice("fp32", f"device {device_type}")
    if probe is None:
        raise ValueError("choosing a CPU compute dtype needs a matmul probe")
    native_flags = sorted(_native_bf16_flags(flags))
    flag_text = (
        "CPU flags unknown"
        if flags is None
        else f"CPU flag {'/'.join(native_flags)}"
        if native_flags
        else "no avx512_bf16/amx_bf16 flag"
    )
    fast = probe.bf16_speedup > MIN_BF16_SPEEDUP and (flags is None or bool(native_flags))
    if requested == "bf16":
        warning = None
        if not fast:
            warning = (
                f"dtype=bf16 requested, but this CPU has no fast bf16 matmul ({flag_text}; {probe.describe()}: "
                f"bf16 is {1 / max(probe.bf16_speedup, 1e-9):.0f}× slower than fp32). Expect a very slow run; "
                "use dtype=auto (or fp32)."
            )
        return DtypeChoice("bf16", f"requested; {flag_text}; {probe.describe()}", warning)
    if fast:
        return DtypeChoice("bf16", f"native bf16 on this CPU: {flag_text}; {probe.describe()}")
    why = "bf16 measured slower" if native_flags else "no native bf16 on this CPU"
    return DtypeChoice("fp32", f"{why}: {flag_text}; {probe.describe()}")


def _native_bf16_flags(flags: frozenset[str] | None) -> set[str]:
    return set() if flags is None else {f for f in BF16_FLAGS if f in flags}


@cache
def _measured_choice(requested: str, device_type: str) -> DtypeChoice:
    if requested == "fp32":
        return choose_compute_dtype(requested, device_type)
    if device_type == "cuda":
        return choose_compute_dtype(requested, device_type, cuda_bf16=torch.cuda.is_bf16_supported())
    if device_type != "cpu":
        return choose_compute_dtype(requested, device_type)
    return choose_compute_dtype(requested, "cpu", flags=cpu_flags(), probe=_cpu_probe())


@lru_cache(maxsize=1)
def _cpu_probe() -> MatmulProbe:
    return probe_matmul()


_REPORTED: set[tuple[str, str]] = set()


def resolve_compute_dtype(requested: str, device: torch.device | str = "cpu", *, quiet: bool = False) -> str:
    """``auto``/``fp32``/``bf16`` → ``fp32``/``bf16`` for ``device``; the first ``auto`` (or slow
    ``bf16``) decision per process and device kind is printed to stderr."""
    device_type = torch.device(device).type
    choice = _measured_choice(requested, device_type)
    key = (requested, device_type)
    if not quiet and key not in _REPORTED and (requested == "auto" or choice.warning):
        _REPORTED.add(key)
        print(choice.line(), file=sys.stderr, flush=True)
        if choice.warning:
            print(f"warning: {choice.warning}", file=sys.stderr, flush=True)
    return choice.dtype


def describe_compute_dtype(requested: str = "auto", device: torch.device | str = "cpu") -> DtypeChoice:
    """The (cached) decision itself, for reports such as the benchmarks' headers."""
    return _measured_choice(requested, torch.device(device).type)
