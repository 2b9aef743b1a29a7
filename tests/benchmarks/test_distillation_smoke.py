"""benchmarks/distillation.py end to end on the tiny model (2 steps per run): it trains a teacher,
exports it and distils into a fresh student (``--no-control``: the controls are the same command
with another teacher path; a teacher equal to the student giving exactly 0 is tested in process,
tests/trainer/test_distillation_training.py)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "distillation.py"


def test_teacher_and_distillation_run_and_report(tiny_model_dir: Path, tmp_path: Path):
    out = tmp_path / "result.json"
    cmd = [sys.executable, str(BENCH), "--model", str(tiny_model_dir), "--teacher-steps", "2", "--steps", "2",
           "--threads", "1", "--no-control", "--work-dir", str(tmp_path / "work"), "--out", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "CPU:" in proc.stdout and "student–teacher KL falls by" in proc.stdout
    results = json.loads(out.read_text())["results"]
    assert set(results) == {"grpo_teacher", "distill"}
    assert (tmp_path / "work" / "teacher_hf" / "config.json").exists()
    assert [step for step, _ in results["distill"]["val"]] == [0, 2]
    # finite, not non-zero: a tiny random teacher scores 0 on every prompt, so its two GRPO steps
    # move it only by weight decay (~3e-7 relative), below bf16's resolution where dtype=auto picks
    # bf16 — its KL to the student can be exactly 0 on such a CPU (a flake on the AMX kind)
    kl = results["distill"]["kl"]
    assert len(kl) == 2 and all(math.isfinite(v) for v in kl) and results["distill"]["samples_per_s"] > 0
