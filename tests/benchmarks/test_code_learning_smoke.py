"""The code-reward learning benchmark's pipeline runs end to end (tiny model, 1 GRPO step).

Checks the wiring — ``hybridflow train`` on code rows starts the local sandbox service, the
scorer processes send every program there, the report and JSON come out — not learning
(``--no-check``): a random tiny model writes no code, so every score is 0.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "code_learning.py"


def test_pipeline_runs_and_reports(tiny_model_dir: Path, tmp_path: Path):
    out = tmp_path / "result.json"
    cmd = [sys.executable, str(BENCH), "--model", str(tiny_model_dir), "--work-dir", str(tmp_path / "work"),
           "--steps", "1", "--val-every", "1", "--prompts-per-step", "4", "--n", "2", "--test-size", "4",
           "--prompt-length", "512", "--response-length", "16", "--threads", "1", "--allow-weak-isolation", "--out", str(out), "--no-check"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "CPU:" in proc.stdout and "] held-out score rises" in proc.stdout
    log = (tmp_path / "work" / "grpo.log").read_text()
    assert "code rewards: local sandbox service at http://127.0.0.1:" in log
    result = json.loads(out.read_text())
    assert [s["step"] for s in result["steps"]] == [1] and [v[0] for v in result["val"]] == [0, 1]
    assert [v[0] for v in result["val_all_passed"]] == [0, 1]  # the scorer's acc, logged as val-aux
    assert all(0.0 <= s["reward"] <= 1.0 for s in result["steps"])
    metrics = [json.loads(line) for line in (tmp_path / "work" / "grpo" / "metrics.jsonl").read_text().splitlines()]
    step = next(m for m in metrics if "critic/score/mean" in m)
    assert step.get("reward/errors", 0.0) == 0.0  # every program reached the sandbox and was judged
