"""The tool-lookup learning benchmark's pipeline runs end to end (tiny model, 2 + 1 GRPO steps).

A correctness check of the script — data, SFT warm start, GRPO with and without tools, the
report and the JSON — not of learning: a random tiny model does not learn the task, so the
criteria are not asserted (``--no-check``).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "agent_tool_lookup.py"


def test_pipeline_runs_and_reports(tiny_model_dir: Path, tmp_path: Path):
    out = tmp_path / "result.json"
    cmd = [sys.executable, str(BENCH), "--model", str(tiny_model_dir), "--work-dir", str(tmp_path / "work"),
           "--steps", "2", "--off-steps", "1", "--sft-size", "8", "--test-size", "4", "--prompts-per-step", "4",
           "--n", "2", "--prompt-length", "768", "--response-length", "64", "--sft-max-length", "1024", "--window-first", "1", "--window-last", "1", "--threads", "1", "--out", str(out), "--no-check"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "CPU:" in proc.stdout and "compute dtype:" in proc.stdout
    assert "multi_turn.enable=true" in proc.stdout and "multi_turn.enable=false" in proc.stdout
    for name in ("reward ≈ 0 with tools disabled", "last reward ≥ 0.5 with tools", "last reward ≥ 3× first"):
        assert f"] {name}" in proc.stdout
    result = json.loads(out.read_text())
    assert [s["step"] for s in result["runs"]["on"]["steps"]] == [1, 2]
    assert [s["step"] for s in result["runs"]["off"]["steps"]] == [1]
    for run in ("on", "off"):
        assert [step for step, _ in result["runs"][run]["val"]] == [0, result["runs"][run]["steps"][-1]["step"]]
        assert all(0.0 <= s["reward"] <= 1.0 for s in result["runs"][run]["steps"])
    assert set(result["checks"]) >= {"tool-call validity rises"}
    assert (tmp_path / "work" / "curves.png").stat().st_size > 0
    # the SFT rows went through the tool prompt: the warm start trained on conversations with tools
    assert (tmp_path / "work" / "sft" / "latest_checkpointed_iteration.txt").read_text().strip() == "1"
