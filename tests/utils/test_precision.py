"""The ``dtype: auto`` rule, decided from faked CPU flags and probe results."""

from __future__ import annotations

import pytest
import torch

from hybridflow.utils import precision
from hybridflow.utils.cpu import cpu_flags, cpu_model
from hybridflow.utils.precision import MatmulProbe, choose_compute_dtype

# Rates measured on the two CPU kinds of this project (256² probe, 2 threads).
FAST = MatmulProbe(fp32_gflops=171.0, bf16_gflops=632.0)  # avx512_bf16
SLOW = MatmulProbe(fp32_gflops=158.0, bf16_gflops=2.7)  # AVX2 only: bf16 has no hardware path
AVX2 = frozenset({"fma", "avx", "avx2"})
ZEN4 = frozenset({"avx2", "avx512f", "avx512_bf16"})


def test_auto_picks_bf16_only_with_flag_and_fast_probe():
    choice = choose_compute_dtype("auto", flags=ZEN4, probe=FAST)
    assert choice.dtype == "bf16"
    assert choice.warning is None
    assert "avx512_bf16" in choice.reason and "632" in choice.reason and "171" in choice.reason


def test_auto_picks_fp32_without_native_bf16():
    choice = choose_compute_dtype("auto", flags=AVX2, probe=SLOW)
    assert choice.dtype == "fp32"
    assert choice.line() == (
        "compute dtype: fp32 (no native bf16 on this CPU: no avx512_bf16/amx_bf16 flag; "
        "bf16 matmul 2.7 vs fp32 158 GFLOP/s)"
    )


def test_auto_trusts_the_probe_over_the_flag():
    # The flag is there but the torch build (or ONEDNN_MAX_CPU_ISA) cannot use it.
    choice = choose_compute_dtype("auto", flags=ZEN4, probe=SLOW)
    assert choice.dtype == "fp32"
    assert choice.reason.startswith("bf16 measured slower")


def test_auto_needs_the_flag_when_flags_are_known():
    # A fast-looking probe without the flag (noise) does not switch an AVX2 CPU to bf16.
    assert choose_compute_dtype("auto", flags=AVX2, probe=FAST).dtype == "fp32"


def test_auto_uses_the_probe_alone_when_flags_are_unknown():
    assert choose_compute_dtype("auto", flags=None, probe=FAST).dtype == "bf16"
    assert choose_compute_dtype("auto", flags=None, probe=SLOW).dtype == "fp32"


@pytest.mark.parametrize("flag", ["amx_bf16", "bf16"])
def test_other_native_flags(flag):
    assert choose_compute_dtype("auto", flags=frozenset({flag}), probe=FAST).dtype == "bf16"


def test_explicit_bf16_on_a_slow_cpu_runs_with_a_warning_giving_the_factor():
    choice = choose_compute_dtype("bf16", flags=AVX2, probe=SLOW)
    assert choice.dtype == "bf16"
    assert choice.warning is not None
    assert "59× slower" in choice.warning  # 158 / 2.7 = 58.5
    assert "dtype=auto" in choice.warning


def test_explicit_bf16_on_a_fast_cpu_has_no_warning():
    choice = choose_compute_dtype("bf16", flags=ZEN4, probe=FAST)
    assert choice.dtype == "bf16" and choice.warning is None


def test_fp32_needs_no_probe():
    assert choose_compute_dtype("fp32").dtype == "fp32"


def test_cuda_follows_bf16_support():
    assert choose_compute_dtype("auto", "cuda", cuda_bf16=True).dtype == "bf16"
    assert choose_compute_dtype("auto", "cuda", cuda_bf16=False).dtype == "fp32"
    assert choose_compute_dtype("bf16", "cuda", cuda_bf16=False).warning is not None


def test_unknown_dtype_is_rejected():
    with pytest.raises(ValueError, match="valid: auto, fp32, bf16"):
        choose_compute_dtype("fp16", probe=FAST)


def test_cpu_flags_reads_x86_and_arm(tmp_path):
    x86 = tmp_path / "x86"
    x86.write_text("processor\t: 0\nmodel name\t: Some CPU\nflags\t\t: fpu avx2 avx512_bf16\n\nprocessor\t: 1\n")
    assert cpu_flags(x86) == frozenset({"fpu", "avx2", "avx512_bf16"})
    assert cpu_model(x86) == "Some CPU"
    arm = tmp_path / "arm"
    arm.write_text("processor\t: 0\nFeatures\t: fp asimd bf16 sve\n")
    assert cpu_flags(arm) == frozenset({"fp", "asimd", "bf16", "sve"})
    assert cpu_flags(tmp_path / "missing") is None


def test_resolve_prints_the_decision_once(monkeypatch, capsys):
    monkeypatch.setattr(precision, "_cpu_probe", lambda: SLOW)
    monkeypatch.setattr(precision, "cpu_flags", lambda: AVX2)
    precision._measured_choice.cache_clear()
    monkeypatch.setattr(precision, "_REPORTED", set())
    try:
        assert precision.resolve_compute_dtype("auto", "cpu") == "fp32"
        assert precision.resolve_compute_dtype("auto", torch.device("cpu")) == "fp32"
        assert precision.resolve_compute_dtype("bf16", "cpu") == "bf16"
        err = capsys.readouterr().err
        assert err.count("compute dtype: fp32 (no native bf16") == 1
        assert err.count("warning: dtype=bf16 requested") == 1
    finally:
        precision._measured_choice.cache_clear()


def test_the_probe_measures_both_dtypes():
    probe = precision.probe_matmul(size=64, repeats=1)
    assert probe.fp32_gflops > 0 and probe.bf16_gflops > 0
