from __future__ import annotations

import os
import time

import pytest

from hybridflow.reward.calls import OK, CallResult, schedule
from hybridflow.reward.executors import EXECUTORS, ScorerPool, run_calls


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
    # 3 s, not less: each call's clock includes starting its process, which took over 0.5 s on a
    # loaded 2-core machine (a flake); the hang still times out, the others finish in milliseconds
    results = run_calls(scorer, calls, executor="process", timeout_s=3.0, num_workers=2)
    assert _statuses(results) == [
        ("ok", 2), ("error", None), ("timeout", None), ("error", None), ("error", None), ("error", None), ("ok", 4)
    ]
    assert results[1].message == "RuntimeError: bad input"
    assert "timeout_s=3.0" in results[2].message
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


def pid_of(x):
    """The scoring process's pid as this process sees it (in its own PID namespace a scorer
    is pid 1; /proc, mounted for ours, names it by our pid for it), or a fault as in ``scorer``."""
    if x in ("hang", "die"):
        scorer(x)
    return int(os.readlink("/proc/self"))


def test_pool_keeps_its_processes_across_batches():
    pool = ScorerPool(pid_of, num_workers=2)
    try:
        first = {r.value for r in pool.run([{"x": "a"}] * 6, timeout_s=5.0)}
        second = {r.value for r in pool.run([{"x": "b"}] * 6, timeout_s=5.0)}
        assert len(first) == 2 and first == second  # the same two processes served both batches
        assert os.getpid() not in first
    finally:
        pool.close()
    with pytest.raises(RuntimeError, match="closed"):
        pool.run([{"x": "a"}], timeout_s=None)


def test_pool_replaces_a_hung_or_dead_process_for_the_batch_only():
    pool = ScorerPool(pid_of, num_workers=2)
    try:
        kept = {r.value for r in pool.run([{"x": "a"}] * 4, timeout_s=5.0)}
        results = pool.run([{"x": "hang"}, {"x": "die"}, {"x": "a"}, {"x": "a"}, {"x": "a"}], timeout_s=0.5)
        assert [r.status for r in results] == ["timeout", "error", "ok", "ok", "ok"]
        assert "exit code 7" in results[1].message
        assert pool.num_alive == 0  # both kept processes were lost; their stand-ins were stopped
        assert not {r.value for r in results[2:]} & kept
        # Later batches still run, on forks made for them.
        assert [r.status for r in pool.run([{"x": "a"}] * 3, timeout_s=5.0)] == ["ok"] * 3
    finally:
        pool.close()


def test_pool_processes_stop_on_close():
    pool = ScorerPool(pid_of, num_workers=1)
    (pid,) = {r.value for r in pool.run([{"x": "a"}], timeout_s=5.0)}
    pool.close()
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline and _alive(pid):
        time.sleep(0.05)
    assert not _alive(pid)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie still answers kill(0)
        return f.read().split()[2] != "Z"


def test_pool_times_hanging_calls_out_together():
    pool = ScorerPool(pid_of, num_workers=1)
    try:
        start = time.monotonic()
        results = pool.run([{"x": "hang"}] * 8 + [{"x": "a"}], timeout_s=2.0)
        elapsed = time.monotonic() - start
        assert [r.status for r in results] == ["timeout"] * 8 + ["ok"]
        assert elapsed < 10.0, f"8 hanging calls × 2 s took {elapsed:.1f} s: timed out one after another (16 s)"
        assert pool.num_alive == 0  # the kept process hung; every stand-in was stopped
    finally:
        pool.close()


def test_thread_executor_times_hanging_calls_out_together():
    start = time.monotonic()
    results = run_calls(scorer, [{"x": "hang"}] * 8, executor="thread", timeout_s=1.0, num_workers=1)
    assert [r.status for r in results] == ["timeout"] * 8
    assert time.monotonic() - start < 5.0  # one after another: 8 s


class FakeRunner:
    """Calls whose outcome is scripted: "hang" never finishes, anything else finishes at once."""

    def __init__(self, behaviour):
        self.behaviour, self.running, self.most, self.cancelled = behaviour, set(), 0, []

    def launch(self, index):
        self.running.add(index)
        self.most = max(self.most, len(self.running))

    def wait(self, timeout):
        done = [(i, CallResult(OK, i)) for i in sorted(self.running) if self.behaviour[i] != "hang"]
        self.running -= {i for i, _ in done}
        if not done:
            time.sleep(timeout if timeout is not None else 0.0)
        return done

    def cancel(self, index):
        self.running.discard(index)
        self.cancelled.append(index)


def test_schedule_caps_stalled_calls_and_keeps_order():
    runner = FakeRunner(["hang"] * 6 + ["ok"])
    results = schedule(runner, [0.2] * 7, num_workers=1, max_stalled=2)
    assert [r.status for r in results] == ["timeout"] * 6 + ["ok"] and results[6].value == 6
    assert runner.most == 3  # 1 worker place + 2 stalled calls, never more
    assert sorted(runner.cancelled) == list(range(6))
    # a call that ends before it stalls holds its place: fast calls never run side by side
    fast = FakeRunner(["ok"] * 5)
    assert [r.value for r in schedule(fast, [1.0] * 5, num_workers=1)] == [0, 1, 2, 3, 4] and fast.most == 1
    # per-call timeouts
    mixed = FakeRunner(["hang", "hang"])
    results = schedule(mixed, [0.1, 0.3], num_workers=2)
    assert [r.message for r in results] == ["no result within timeout_s=0.1", "no result within timeout_s=0.3"]
