"""Run scoring calls with fault containment: exceptions and hangs become per-call results.

Three executors, behind the ``EXECUTORS`` registry:

* ``process`` (default) — scorer processes (``pool.py``, set up as ``scorer_process.py`` describes:
  own PID namespace where allowed, own session, memory cap) take calls one at a time; a call
  running past ``timeout_s`` gets its process killed. A hang is truly stopped and a crash
  (segfault, ``os._exit``) is contained. Needs picklable arguments and results.
  :func:`run_processes` forks per batch; a :class:`ScorerPool` keeps its processes across
  batches (what the reward managers use). Where ``fork`` is not available (macOS, Windows)
  ``spawn`` is used, which also needs an importable scoring function.
* ``thread`` — each call in a daemon thread; a call past ``timeout_s`` is abandoned but keeps
  running in the background (Python cannot kill a thread), so a scorer stuck in a busy loop
  keeps burning a core. Use it only for scorers that cannot be forked.
* ``inline`` — plain calls in this process: exceptions are contained, hangs are not, so it
  refuses a ``timeout_s``.

``process`` and ``thread`` time calls out concurrently: a call running longer than
``calls.stall_after`` frees its place for the next one (see ``calls.py``).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any

from hybridflow.reward.calls import (
    ERROR,
    OK,
    TIMEOUT,
    CallResult,
    call_safely,
    schedule,
)
from hybridflow.reward.pool import ScorerPool, ScorerStartError, run_processes
from hybridflow.reward.scorer_process import DEFAULT_MEMORY_LIMIT_MB, ScorerSettings
from hybridflow.utils.registry import Registry

Executor = Callable[[Callable[..., Any], list[dict[str, Any]], "float | None", int], list[CallResult]]
EXECUTORS: Registry[Executor] = Registry("reward executor")


@EXECUTORS.register("inline")
def run_inline(
    fn: Callable[..., Any], calls: list[dict[str, Any]], timeout_s: float | None, num_workers: int
) -> list[CallResult]:
    """Call ``fn(**kwargs)`` for each call in order, here."""
    if timeout_s is not None:
        raise ValueError("the inline reward executor cannot enforce timeout_s; use 'process' or 'thread'")
    return [call_safely(fn, kwargs) for kwargs in calls]


class _ThreadRunner:
    """Each call in a daemon thread that reports to a queue; a cancelled call is abandoned."""

    def __init__(self, fn: Callable[..., Any], calls: list[dict[str, Any]]) -> None:
        self.fn, self.calls = fn, calls
        self.finished: queue.SimpleQueue[tuple[int, CallResult]] = queue.SimpleQueue()

    def launch(self, index: int) -> CallResult | None:
        def run() -> None:
            self.finished.put((index, call_safely(self.fn, self.calls[index])))

        threading.Thread(target=run, daemon=True, name="hybridflow-reward").start()
        return None

    def wait(self, timeout: float | None) -> list[tuple[int, CallResult]]:
        try:
            done = [self.finished.get(timeout=timeout)]
        except queue.Empty:
            return []
        while not self.finished.empty():
            done.append(self.finished.get_nowait())
        return done

    def cancel(self, index: int) -> None:
        pass  # a thread cannot be stopped; its late result is ignored


@EXECUTORS.register("thread")
def run_threads(
    fn: Callable[..., Any], calls: list[dict[str, Any]], timeout_s: float | None, num_workers: int
) -> list[CallResult]:
    """Up to ``num_workers`` calls at a time (plus stalled ones) in daemon threads; late calls are abandoned as timeouts."""
    return schedule(_ThreadRunner(fn, calls), [timeout_s] * len(calls), num_workers)


@EXECUTORS.register("process")
def _run_processes(
    fn: Callable[..., Any], calls: list[dict[str, Any]], timeout_s: float | None, num_workers: int
) -> list[CallResult]:
    """Calls spread over scorer processes forked for them, with the default settings."""
    return run_processes(fn, calls, timeout_s, num_workers)


def run_calls(
    fn: Callable[..., Any],
    calls: list[dict[str, Any]],
    *,
    executor: str = "process",
    timeout_s: float | None = None,
    num_workers: int = 1,
) -> list[CallResult]:
    """``fn(**kwargs)`` for every ``kwargs`` in ``calls``, one :class:`CallResult` each, in order."""
    if timeout_s is not None and timeout_s <= 0:
        raise ValueError(f"timeout_s must be positive or None, got {timeout_s}")
    if num_workers < 1:
        raise ValueError(f"num_workers must be at least 1, got {num_workers}")
    if not calls:
        return []
    return EXECUTORS.get(executor)(fn, calls, timeout_s, num_workers)


__all__ = [
    "DEFAULT_MEMORY_LIMIT_MB",
    "ERROR",
    "EXECUTORS",
    "OK",
    "TIMEOUT",
    "CallResult",
    "ScorerPool",
    "ScorerSettings",
    "ScorerStartError",
    "run_calls",
    "run_inline",
    "run_processes",
    "run_threads",
]
