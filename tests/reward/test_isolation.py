"""Scorer processes are kept from the trainer: PID namespace (or the reported session fallback),
memory cap, and a custom reward file imported only in them, under the timeout."""

from __future__ import annotations

import logging
import os
import sys
import time

import pytest

from hybridflow.config import load_config
from hybridflow.entrypoints.train import build_reward_fns
from hybridflow.reward import (
    DEFAULT_MEMORY_LIMIT_MB,
    CustomRewardFunction,
    NaiveRewardManager,
    ScorerPool,
    ScorerSettings,
    ScorerStartError,
    scorer_process,
)
from hybridflow.reward import pool as pool_module


def probe(what, trainer_pid=0, size=0):
    """What a scorer can see of, or do to, the process that made it."""
    if what == "ids":
        return os.getpid(), os.getppid()
    if what == "kill-parent":
        os.kill(os.getppid(), 9)
        return "still here"
    if what == "signal-trainer":
        os.kill(trainer_pid, 0)  # signal 0: only checks that the trainer can be reached
        return "reached"
    if what == "session":
        return os.getsid(0)
    if what == "allocate":
        return len(bytes(size))  # calloc: untouched pages, so a missing cap costs no memory
    if what == "limit":
        import resource

        return resource.getrlimit(resource.RLIMIT_AS)[1]
    raise ValueError(what)


def _namespaces_allowed() -> bool:
    """Whether this machine lets an unprivileged process make a user + PID namespace, checked
    independently of the code under test: a forked child calls unshare(2) itself."""
    import ctypes

    pid = os.fork()
    if pid == 0:
        libc = ctypes.CDLL(None, use_errno=True)
        os._exit(0 if libc.unshare(0x10000000 | 0x20000000) == 0 else 1)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status) == 0


@pytest.fixture
def fresh_warnings(monkeypatch):
    monkeypatch.setattr(pool_module, "_warned", set())


def test_a_scorer_cannot_kill_the_trainer(caplog, fresh_warnings):
    with caplog.at_level(logging.WARNING, logger="hybridflow.reward.pool"):
        pool = ScorerPool(probe, num_workers=1)
    try:
        me = os.getpid()
        if _namespaces_allowed():
            assert pool.isolation == scorer_process.PID_NAMESPACE
            ids, killed, reach = pool.run(
                [{"what": "ids"}, {"what": "kill-parent"}, {"what": "signal-trainer", "trainer_pid": me}], timeout_s=5.0
            )
            assert ids.value == (1, 0)  # pid 1 of its namespace; the trainer has no pid there
            # kill(0, 9) reaches only the scorer's own group, where it is init: nothing dies
            assert killed.status == "ok" and os.getpid() == me
            assert reach.status == "error" and reach.message.startswith("ProcessLookupError")
            assert not caplog.records
        else:  # namespaces refused here: the weaker isolation must be reported
            assert pool.isolation == scorer_process.SESSION
            assert "can still signal the trainer" in caplog.text
    finally:
        pool.close()


def test_without_namespaces_the_weaker_isolation_is_reported(monkeypatch, caplog, fresh_warnings):
    monkeypatch.setattr(scorer_process, "_UNSHARE", None)  # as where unshare(2) is refused
    with caplog.at_level(logging.WARNING, logger="hybridflow.reward.pool"):
        pool = ScorerPool(probe, num_workers=1)
    try:
        assert pool.isolation == scorer_process.SESSION
        [warning] = [r.getMessage() for r in caplog.records]
        assert "no PID namespace" in warning and "can still signal the trainer by its pid" in warning
        session, reach = pool.run(
            [{"what": "session"}, {"what": "signal-trainer", "trainer_pid": os.getpid()}], timeout_s=5.0
        )
        assert session.value != os.getsid(0)  # its own session: no group signal reaches us
        assert reach.value == "reached"  # the documented weakness: a pid still does
    finally:
        pool.close()


def test_memory_cap_turns_a_large_allocation_into_that_items_error():
    pool = ScorerPool(probe, num_workers=1, settings=ScorerSettings(memory_limit_mb=256))
    try:
        small, big = pool.run(
            [{"what": "allocate", "size": 64 << 20}, {"what": "allocate", "size": 1 << 30}], timeout_s=5.0
        )
        assert small.value == 64 << 20
        assert big.status == "error"
        assert big.message.startswith("MemoryError") and "256 MiB" in big.message
        assert "reward_model.memory_limit_mb" in big.message
        # the process survived its MemoryError and still scores
        assert pool.run([{"what": "allocate", "size": 1 << 20}], timeout_s=5.0)[0].value == 1 << 20
    finally:
        pool.close()


def test_default_cap_stops_20_gib():
    assert DEFAULT_MEMORY_LIMIT_MB < 20 * 1024
    pool = ScorerPool(probe, num_workers=1)
    try:
        limit, big = pool.run([{"what": "limit"}, {"what": "allocate", "size": 20 << 30}], timeout_s=5.0)
        assert limit.value <= scorer_process._address_space_bytes() + DEFAULT_MEMORY_LIMIT_MB * 2**20 + (512 << 20)
        assert big.status == "error" and big.message.startswith("MemoryError")
    finally:
        pool.close()
    uncapped = ScorerPool(probe, num_workers=1, settings=ScorerSettings(memory_limit_mb=0))
    try:
        import resource

        assert uncapped.run([{"what": "limit"}], timeout_s=5.0)[0].value == resource.getrlimit(resource.RLIMIT_AS)[1]
    finally:
        uncapped.close()


REWARD_FILE = """
import os
with open({marker!r}, "a") as f:
    f.write(f"{{int(os.readlink('/proc/self'))}}\\n")
{extra}

def compute_score(data_source, solution_str, ground_truth, extra_info=None, bonus=0.0):
    return float(len(solution_str)) + bonus
"""


def _reward_file(tmp_path, extra=""):
    marker = tmp_path / "imported_by"
    path = tmp_path / f"reward_{abs(hash(extra))}.py"
    path.write_text(REWARD_FILE.format(marker=str(marker), extra=extra))
    return path, marker


def test_custom_file_is_imported_in_the_scorers_only(tmp_path, tokenizer, make_batch):
    path, marker = _reward_file(tmp_path)
    manager = NaiveRewardManager(
        tokenizer, compute_score=CustomRewardFunction(str(path), "compute_score", {"bonus": 0.5}), num_workers=2
    )
    try:
        data, _ = make_batch(["abcd", "ab"], ["x", "y"], data_sources=["any", "any"])
        reward, _ = manager(data)
        assert reward.sum(-1).tolist() == [4.5, 2.5]
        importers = {int(line) for line in marker.read_text().split()}
        assert len(importers) == 2 and os.getpid() not in importers  # once in each scorer process
        assert not [m for m in sys.modules if m.startswith("hybridflow_custom_reward_reward_")]
    finally:
        manager.close()


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        ("os._exit(7)", r"ended its scorer process \(exit code 7\) before it was ready"),
        ("raise ValueError('no config here')", r"failed: ImportError: .*importing .* failed: ValueError: no config here"),
        ("ballast = bytes(20 << 30)", r"failed: ImportError: .*MemoryError"),
        ("import time; time.sleep(60)", r"did not finish within 1.0 s \(reward_model.timeout_s\)"),
    ],
    ids=["exit", "raise", "allocate", "hang"],
)
def test_module_level_faults_are_reported_not_suffered(tmp_path, tokenizer, extra, expected):
    path, _ = _reward_file(tmp_path, extra)
    start = time.monotonic()
    with pytest.raises(ScorerStartError, match=expected) as info:
        NaiveRewardManager(tokenizer, compute_score=CustomRewardFunction(str(path)), timeout_s=1.0)
    assert str(path) in str(info.value)
    assert time.monotonic() - start < 10.0  # a hang costs the timeout, not 60 s


def test_build_reward_fns_imports_nothing_in_the_trainer(tmp_path, tokenizer):
    path, marker = _reward_file(tmp_path)
    config = load_config(None, [
        f"custom_reward_function.path={path}", "reward_model.memory_limit_mb=512", "reward_model.reward_manager=prime",
        "reward_model.num_workers=2",
    ])
    manager, val_manager = build_reward_fns(config, tokenizer)
    try:
        assert manager is val_manager and isinstance(manager.compute_score, CustomRewardFunction)
        assert manager.memory_limit_mb == 512 and manager.num_workers == 2
        assert os.getpid() not in {int(line) for line in marker.read_text().split()}
    finally:
        manager.close()
    missing = load_config(None, [f"custom_reward_function.path={tmp_path / 'nope.py'}"])
    with pytest.raises(FileNotFoundError, match="custom_reward_function.path: no such file .*nope.py"):
        build_reward_fns(missing, tokenizer)


def test_thread_executor_imports_the_file_when_the_manager_is_made(tmp_path, tokenizer):
    path, marker = _reward_file(tmp_path, "raise ValueError('broken at import')")
    with pytest.raises(ImportError, match="importing .* failed: ValueError: broken at import"):
        NaiveRewardManager(tokenizer, compute_score=CustomRewardFunction(str(path)), executor="thread")
    assert marker.read_text().split() == [str(os.getpid())]  # here, as documented for thread/inline
