"""The update benchmark times the actor and a plain Hugging Face forward-backward on the same rows
in the same run and prints both with their ratio."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "train.py"


def test_actor_update_is_timed_against_a_plain_hf_update(tiny_model_dir: Path, tmp_path: Path):
    cmd = [
        sys.executable,
        str(BENCH),
        "--model",
        str(tiny_model_dir),
        "--dtypes",
        "fp32",
        "--steps",
        "1",
        "--rows",
        "4",
        "--micro",
        "4",
        "--prompt-len",
        "8",
        "--response-len",
        "8",
        "--threads",
        "1",
        "--matmul-size",
        "256",
        "--matmul-repeats",
        "1",
        "--out",
        str(tmp_path / "r.json"),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    header = next(line for line in proc.stdout.splitlines() if line.startswith("dtype "))
    assert header.split()[-2:] == ["s/update", "HF/ours"]
    result = json.loads((tmp_path / "r.json").read_text())["results"]["fp32"]
    assert result["seconds"] > 0 and result["hf_seconds"] > 0
