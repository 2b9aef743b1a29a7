"""Placement over two machines: Ray's local multi-node test cluster puts one FSDP rank on each node."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.ray

REPO_ROOT = Path(__file__).resolve().parents[2]


def test_ranks_are_placed_on_both_nodes_and_train_together(tiny_model_dir: Path) -> None:
    # A subprocess: ray.cluster_utils.Cluster needs a Ray driver of its own, and this test
    # session's Ray instance (shared by other tests) must stay untouched.
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "HF_HUB_OFFLINE": "1", "RAY_DEDUP_LOGS": "0"}
    proc = subprocess.run(
        [sys.executable, "-m", "tests.scale.two_node_cluster", str(tiny_model_dir)],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=240,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    [line] = [l for l in proc.stdout.splitlines() if l.startswith("TWO_NODE_RESULT ")]
    result = json.loads(line.split(" ", 1)[1])
    assert len(result["cluster_nodes"]) == 2
    assert sorted(result["rank_nodes"]) == result["cluster_nodes"]  # rank 0 and rank 1 on different nodes
    assert result["engines"] == ["FSDPEngine", "FSDPEngine"] and result["world_sizes"] == [2, 2]
    assert result["max_abs_diff"] < 1e-5  # the two-node log-probs equal one process's
