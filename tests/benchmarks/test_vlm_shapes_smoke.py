"""The VLM learning benchmark's pipeline runs end to end at tiny sizes (2 SFT steps, 2 GRPO steps)
and reports finite held-out accuracies. Checks the wiring, not learning: 2 SFT steps teach nothing."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "vlm_shapes.py"


def test_sft_then_grpo_reports_a_table_and_curves(tmp_path: Path) -> None:
    out, png = tmp_path / "run", tmp_path / "curves.png"
    cmd = [sys.executable, str(BENCH), "--out", str(out), "--png", str(png), "--train-size", "16",
           "--test-size", "8", "--sft-steps", "2", "--sft-batch", "4", "--grpo-steps", "2", "--prompts", "4",
           "--n", "2", "--test-freq", "2", "--threads", "1"]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "| phase | step | wall (s) | held-out accuracy (n=8) | s.e. |" in proc.stdout
    result = json.loads((out / "vlm_shapes.json").read_text())
    assert result["n_test"] == 8
    assert [(r["phase"], r["step"]) for r in result["table"]] == [("sft", 2), ("grpo", 2)]
    assert all(math.isfinite(r["acc"]) and 0.0 <= r["acc"] <= 1.0 for r in result["table"])
    assert math.isfinite(result["gain"]) and png.stat().st_size > 0
