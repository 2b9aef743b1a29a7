"""The SFT scaling benchmark runs its three launches (one plain process, torchrun with 1 and 2
ranks) on the tiny model and reports each with a positive token rate and the same losses."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "sft_scaling.py"
VARIANTS = ("dp1-plain", "dp1-torchrun", "dp2-torchrun")


def test_every_launch_is_timed_on_the_same_job(tiny_model_dir: Path, tmp_path: Path):
    out = tmp_path / "sft_scaling.json"
    cmd = [
        sys.executable,
        str(BENCH),
        "--model",
        str(tiny_model_dir),
        "--steps",
        "2",
        "--batch",
        "4",
        "--micro-batch",
        "2",
        "--max-length",
        "128",
        "--digits",
        "1",
        "--threads",
        "2",
        "--work",
        str(tmp_path / "work"),
        "--out",
        str(out),
    ]
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    elapsed = time.perf_counter() - start
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert any(line.startswith("CPU:") for line in lines)
    table = [[cell.strip() for cell in line.strip().strip("|").split("|")] for line in lines if line.startswith("| dp")]
    rows = {cells[0]: cells for cells in table}
    assert set(rows) == set(VARIANTS), lines
    assert [rows[v][2] for v in VARIANTS] == ["1 × 2", "1 × 2", "2 × 1"]
    assert all(float(rows[v][6]) > 0 for v in VARIANTS)
    report = json.loads(out.read_text())
    results = {r["label"]: r for r in report["results"]}
    assert set(results) == set(VARIANTS)
    assert all(r["timed_steps"] == 2 and r["tokens"] > 0 and r["tokens_per_s"] > 0 for r in results.values())
    # the same job everywhere: same real tokens per step, losses equal up to float rounding
    assert len({r["tokens"] for r in results.values()}) == 1
    base = results["dp1-plain"]["losses"]
    assert all(abs(a - b) <= 1e-5 * abs(b) for r in results.values() for a, b in zip(r["losses"], base, strict=True))
    if not report["packing"]["available"]:
        assert "packed: not measured" in proc.stdout and "use_remove_padding" in proc.stdout
    print(f"sft_scaling smoke run: {elapsed:.1f} s")
    assert elapsed < 60, elapsed
