"""The tool-task step-time benchmark: its pure helpers on hand-made rows, and one end-to-end run
that times this checkout against itself (tiny model, 2 steps) and reports both "trees"."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
import tool_step_time  # noqa: E402


def test_parse_trees_rejects_bad_specs(tmp_path: Path):
    assert tool_step_time.parse_trees([f"a={ROOT}", f"b={ROOT}"]) == {"a": ROOT, "b": ROOT}
    with pytest.raises(SystemExit, match="NAME=PATH"):
        tool_step_time.parse_trees([f"a={ROOT}", f"b={tmp_path}"])  # no hybridflow/ there
    with pytest.raises(SystemExit, match="NAME=PATH"):
        tool_step_time.parse_trees([str(ROOT), f"b={ROOT}"])
    with pytest.raises(SystemExit, match="at least two"):
        tool_step_time.parse_trees([f"a={ROOT}"])


def test_summarize_leaves_out_the_first_step_of_each_run():
    def row(step: int, total: float, gen: float) -> dict:
        return {"step": step, "timing_s/step": total, "timing_s/gen": gen, "timing_s/update_actor": 1.0,
                "response_length/mean": float(step), "tool_call_counts/mean": 1.0, "critic/score/mean": 0.5}

    runs = [[row(1, 99.0, 90.0), row(2, 4.0, 2.0), row(3, 6.0, 3.0)], [row(1, 50.0, 40.0), row(2, 5.0, 2.5)]]
    result = tool_step_time.summarize(runs)
    assert result["median_s"] == {"timing_s/step": 5.0, "timing_s/gen": 2.5, "timing_s/update_actor": 1.0}
    # steps 2, 3 of run 1 and step 2 of run 2
    assert result["mean_work"] == {"response_length/mean": 7 / 3, "tool_call_counts/mean": 1.0, "critic/score/mean": 0.5}


def test_two_trees_run_and_are_reported(tiny_model_dir: Path, tmp_path: Path):
    out = tmp_path / "result.json"
    cmd = [sys.executable, str(ROOT / "benchmarks" / "tool_step_time.py"), "--tree", f"a={ROOT}", "--tree", f"b={ROOT}",
           "--model", str(tiny_model_dir), "--work-dir", str(tmp_path / "work"), "--steps", "2", "--repeats", "1",
           "--prompts-per-step", "4", "--n", "2", "--sft-size", "8", "--prompt-length", "768", "--response-length", "32",
           "--sft-max-length", "1024", "--threads", "1", "--out", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "tool-task GRPO step" in proc.stdout and "(a/b " in proc.stdout
    result = json.loads(out.read_text())
    for name in ("a", "b"):
        assert [row["step"] for row in result["runs"][name][0]] == [1, 2]
        assert set(result["results"][name]["median_s"]) == {"timing_s/step", "timing_s/gen", "timing_s/update_actor"}
        assert result["results"][name]["median_s"]["timing_s/gen"] > 0
        assert result["results"][name]["mean_work"]["response_length/mean"] > 0
