from __future__ import annotations

import os
import time

import pytest

from hybridflow.workers.reward.executors import EXECUTORS, run_calls


def scorer(x):
    if x == "raise":
        raise RuntimeError("bad input")
    if x == "hang":
        time.sleep(60)
    if x == "die":
        os._exit(7)
    if x == "unpicklable":
        return lambda: 0
    if x == "exit":
        raise SystemExit(3)
    return len(x)


def _statuses(results):
    return [(r.status, r.value) for r in results]


def test_registry():
    assert EXECUTORS.names() == ["inline", "process", "thread"]


def test_process_contains_every_fault():
    calls = [{"x": v} for v in ["ab", "raise", "hang", "die", "unpicklable", "exit", "abcd"]]
    results = run_calls(scorer, calls, executor="process", timeout_s=0.5, num_workers=2)
    assert _statuses(results) == [
        ("ok", 2), ("error", None), ("timeout", None), ("error", None), ("error", None), ("error", None), ("ok", 4)
    ]
    assert results[1].message == "RuntimeError: bad input"
    assert "timeout_s=0.5" in results[2].message
    assert "exit code 7" in results[3].message
    assert "could not be sent back" in results[4].message


def test_process_keeps_order_with_many_workers():
    calls = [{"x": "a" * n} for n in range(12)]
    assert [r.value for r in run_calls(scorer, calls, executor="process", num_workers=3)] == list(range(12))


def test_thread_abandons_a_hang():
    results = run_calls(scorer, [{"x": "abc"}, {"x": "hang"}, {"x": "raise"}], executor="thread", timeout_s=0.3, num_workers=2)
    assert [r.status for r in results] == ["ok", "timeout", "error"]


def test_inline():
    assert _statuses(run_calls(scorer, [{"x": "a"}, {"x": "raise"}], executor="inline")) == [("ok", 1), ("error", None)]
    with pytest.raises(ValueError, match="cannot enforce timeout_s"):
        run_calls(scorer, [{"x": "a"}], executor="inline", timeout_s=1.0)


def test_bad_arguments():
    assert run_calls(scorer, [], executor="process") == []
    with pytest.raises(ValueError, match="unknown reward executor 'gpu'"):
        run_calls(scorer, [{"x": "a"}], executor="gpu")
    with pytest.raises(ValueError, match="timeout_s must be positive"):
        run_calls(scorer, [{"x": "a"}], timeout_s=0)
