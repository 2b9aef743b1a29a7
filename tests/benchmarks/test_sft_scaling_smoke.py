"""The SFT scaling benchmark runs its launches (here one plain process and torchrun with 2 ranks;
torchrun with 1 rank is the same code path with one rank), padded and packed, on the tiny model
and reports each with a positive token rate and the same losses."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "sft_scaling.py"
LAUNCHES = ("dp1-plain", "dp2-torchrun")
VARIANTS = (*LAUNCHES, *(f"{name}-packed" for name in LAUNCHES))


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
        "--launches",
        ",".join(LAUNCHES),
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
    assert [rows[v][2] for v in VARIANTS] == ["1 × 2", "2 × 1"] * 2
    assert [rows[v][3] for v in VARIANTS] == ["padded"] * 2 + ["packed"] * 2
    assert all(float(rows[v][6]) > 0 for v in VARIANTS)
    # packed vs padded: the packed rate over the same launch's padded rate
    for name in LAUNCHES:
        ratio = float(rows[f"{name}-packed"][6]) / float(rows[name][6])
        assert rows[f"{name}-packed"][8] == f"{ratio:.2f}×" and rows[name][8] == "—"
    report = json.loads(out.read_text())
    results = {r["label"]: r for r in report["results"]}
    assert set(results) == set(VARIANTS)
    assert all(r["timed_steps"] == 2 and r["tokens"] > 0 and r["tokens_per_s"] > 0 for r in results.values())
    assert [results[v]["packed"] for v in VARIANTS] == [False] * 2 + [True] * 2
    # the same job everywhere: same real tokens per step, losses equal up to float rounding
    assert len({r["tokens"] for r in results.values()}) == 1
    base = results["dp1-plain"]["losses"]
    assert all(abs(a - b) <= 1e-5 * abs(b) for r in results.values() for a, b in zip(r["losses"], base, strict=True))
    # each launch's command line (printed before it runs) asks for packed rows exactly when packed
    commands = {v: [line for line in lines if line.startswith("$ ") and f"/runs/{v} " in line] for v in VARIANTS}
    assert all(len(found) == 1 for found in commands.values()), commands
    assert [("model.use_remove_padding=true" in commands[v][0]) for v in VARIANTS] == [False] * 2 + [True] * 2
    print(f"sft_scaling smoke run: {elapsed:.1f} s")
    assert elapsed < 150, elapsed  # 4 launches, each mostly importing torch: 88 s at load average 5 on 2 cores
