"""The asynchronous-training benchmark runs its three modes end to end on the tiny model (2
steps each) and reports held-out accuracy, overlap and staleness. Wiring only: a tiny random
model learns nothing."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "async_training.py"


def test_three_modes_run_and_report(tiny_model_dir: Path, tmp_path: Path):
    out = tmp_path / "result.json"
    cmd = [sys.executable, str(BENCH), "--model", str(tiny_model_dir), "--steps", "2", "--threads", "1",
           "--work-dir", str(tmp_path / "work"), "--out", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "CPU:" in proc.stdout and "predicted speed-up" in proc.stdout
    results = json.loads(out.read_text())["results"]
    assert set(results) == {"sync", "one_step_off", "fully_async"}
    assert [step for step, _ in results["sync"]["val"]] == [0, 2]
    assert results["one_step_off"]["staleness_max"] == 1 and results["fully_async"]["staleness_max"] <= 2
    assert 0 <= results["one_step_off"]["overlap_fraction"] <= 1 and results["fully_async"]["dropped"] == 0
