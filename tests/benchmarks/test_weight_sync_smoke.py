"""The weight-sync benchmark runs every backend on the tiny model and checks each transfer bit
for bit (it exits non-zero on a mismatch)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "weight_sync.py"


def test_every_backend_is_timed_against_the_baseline(tiny_model_dir: Path):
    cmd = [sys.executable, str(BENCH), "--model", str(tiny_model_dir), "--repeats", "1", "--bucket-mb", "1",
           "--threads", "1"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("CPU:")
    rows = {line.split()[0]: line.split() for line in lines if line.split() and line.split()[0] in
            ("baseline", "inproc", "disk", "http")}
    assert set(rows) == {"baseline", "inproc", "disk", "http"} and float(rows["baseline"][3]) == 1.0
    assert all(float(row[1]) > 0 for row in rows.values())
