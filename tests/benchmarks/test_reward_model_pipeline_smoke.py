"""The reward-model benchmark's pipeline runs end to end on the tiny model (2 RM steps, 1 GRPO
step): pairs → ``hybridflow rm`` → ``hybridflow train`` with the exported reward model as the
reward and the rule logged beside it. Wiring only (``--no-check``): a tiny random model learns
nothing."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "reward_model_pipeline.py"


def test_pipeline_runs_and_reports(tiny_model_dir: Path, tmp_path: Path):
    out = tmp_path / "result.json"
    cmd = [sys.executable, str(BENCH), "--model", str(tiny_model_dir), "--work-dir", str(tmp_path / "work"),
           "--pairs", "32", "--rm-steps", "2", "--rm-batch", "8", "--steps", "1", "--val-every", "1", "--test-size", "8",
           "--threads", "1", "--no-rule-baseline", "--out", str(out), "--png", str(tmp_path / "curves.png"), "--no-check"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "CPU:" in proc.stdout and "reward hacking" in proc.stdout and "] held-out rule accuracy rises" in proc.stdout
    result = json.loads(out.read_text())
    assert [s for s, _ in result["reward_model"]["val_accuracy"]] == [0, 1, 2]  # before training, test_freq, the end
    run = result["grpo_rm"]
    assert [s["step"] for s in run["steps"]] == [1] and [v["step"] for v in run["val"]] == [0, 1]
    assert 0.0 <= run["steps"][0]["rule"] <= 1.0 and all(0.0 <= v["accuracy"] <= 1.0 for v in run["val"])
    assert run["steps"][0]["reward"] not in (0.0, 1.0)  # the reward model's score, not the rule's
    assert (tmp_path / "curves.png").stat().st_size > 0
    metrics = [json.loads(line) for line in (tmp_path / "work" / "grpo_rm" / "metrics.jsonl").read_text().splitlines()]
    assert next(m for m in metrics if "critic/score/mean" in m)["reward/errors"] == 0.0
