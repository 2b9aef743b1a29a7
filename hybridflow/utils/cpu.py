"""What CPU this is, read from ``/proc/cpuinfo`` without importing torch (benchmarks' parent
processes stay small)."""

from __future__ import annotations

import platform
from pathlib import Path

# Flags worth naming in a report: the vector ISA and the native bf16 units.
REPORTED_FLAGS: tuple[str, ...] = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile", "bf16", "asimd", "sve")


def cpu_flags(cpuinfo: str | Path = "/proc/cpuinfo") -> frozenset[str] | None:
    """The CPU's feature flags (``flags`` on x86, ``Features`` on ARM), or None if unreadable."""
    try:
        text = Path(cpuinfo).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return frozenset(value.split())
    return None


def cpu_model(cpuinfo: str | Path = "/proc/cpuinfo") -> str:
    """The CPU model name (``model name`` line), or the platform's processor string."""
    try:
        for line in Path(cpuinfo).read_text(encoding="utf-8", errors="replace").splitlines():
            key, _, value = line.partition(":")
            if key.strip() in ("model name", "Model", "Hardware") and value.strip():
                return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def reported_flags(flags: frozenset[str] | None) -> list[str]:
    """The :data:`REPORTED_FLAGS` this CPU has, in that order."""
    return [] if flags is None else [f for f in REPORTED_FLAGS if f in flags]
