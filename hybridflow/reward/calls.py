"""Scoring calls as results, and the scheduler that runs them with per-call timeouts.

Every executor turns ``fn(**kwargs)`` into a :class:`CallResult` (``ok`` / ``error`` /
``timeout``). :func:`schedule` is the loop the ``thread`` and ``process`` executors share:
it keeps ``num_workers`` calls running, and a call that has been running for ``stall_after``
seconds (0.25 s, or a quarter of its timeout if that is shorter) is *stalled*: it keeps
running until it ends or times out, but no longer holds one of the ``num_workers`` places,
so the next call starts beside it. Hanging calls therefore time out together, not one after
another: 8 hanging calls with a 2 s timeout take ~2 s + 8 × 0.25 s, not 16 s. At most
``MAX_STALLED`` stalled calls run beside the ``num_workers`` (a cap on processes/threads).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

OK, ERROR, TIMEOUT = "ok", "error", "timeout"
STALL_S = 0.25
MAX_STALLED = 32


@dataclass(frozen=True)
class CallResult:
    """What one call produced: ``status`` is ``ok`` (``value`` set), ``error`` or ``timeout`` (``message`` set)."""

    status: str
    value: Any = None
    message: str = ""


def describe(exc: BaseException) -> str:
    """``"Type: message"``; a bare ``MemoryError`` (Python gives it no text) says what it means."""
    text = str(exc)
    if isinstance(exc, MemoryError) and not text:
        text = "out of memory"
    return f"{type(exc).__name__}: {text}"


def call_safely(fn: Callable[..., Any], kwargs: dict[str, Any]) -> CallResult:
    """``fn(**kwargs)`` as a :class:`CallResult`; exceptions (``SystemExit`` too) become errors."""
    try:
        return CallResult(OK, fn(**kwargs))
    except (Exception, SystemExit) as exc:  # noqa: BLE001 - KeyboardInterrupt still stops the run
        return CallResult(ERROR, message=describe(exc))


def timeout_result(timeout_s: float) -> CallResult:
    return CallResult(TIMEOUT, message=f"no result within timeout_s={timeout_s}")


def stall_after(timeout_s: float | None) -> float:
    """Seconds after which a running call stops holding a worker place (see the module docstring)."""
    return STALL_S if timeout_s is None else min(STALL_S, timeout_s / 4)


class Runner(Protocol):
    """How an executor starts, waits for and abandons calls (by index into the call list)."""

    def launch(self, index: int) -> CallResult | None:
        """Start call ``index``; a :class:`CallResult` if it failed to start (then it is done)."""

    def wait(self, timeout: float | None) -> list[tuple[int, CallResult]]:
        """Calls that finished within ``timeout`` seconds (possibly none)."""

    def cancel(self, index: int) -> None:
        """Stop (or abandon) call ``index``, which ran past its timeout."""


def schedule(
    runner: Runner, timeouts: Sequence[float | None], num_workers: int, max_stalled: int = MAX_STALLED
) -> list[CallResult]:
    """Run calls ``0 .. len(timeouts) - 1`` on ``runner``; call ``i`` times out after ``timeouts[i]`` s."""
    results: list[CallResult | None] = [None] * len(timeouts)
    pending = deque(range(len(timeouts)))
    running: dict[int, float] = {}  # index → start time
    while pending or running:
        _launch_pending(runner, timeouts, num_workers, max_stalled, pending, running, results)
        if not running:
            continue
        for index, result in runner.wait(_next_event(timeouts, running, bool(pending))):
            if index in running:  # an abandoned thread may still report
                del running[index]
                results[index] = result
        now = time.monotonic()
        for index, started in list(running.items()):
            limit = timeouts[index]
            if limit is not None and now - started >= limit:
                del running[index]
                results[index] = timeout_result(limit)
                runner.cancel(index)
    return [r if r is not None else CallResult(ERROR, message="no result") for r in results]


def _launch_pending(runner, timeouts, num_workers, max_stalled, pending: deque, running: dict, results: list) -> None:
    while pending:
        now = time.monotonic()
        active = sum(1 for i, started in running.items() if now - started < stall_after(timeouts[i]))
        if active >= num_workers or len(running) >= num_workers + max_stalled:
            return
        index = pending.popleft()
        failure = runner.launch(index)
        if failure is not None:
            results[index] = failure
        else:
            running[index] = time.monotonic()


def _next_event(timeouts: Sequence[float | None], running: dict[int, float], has_pending: bool) -> float | None:
    """Seconds until a running call times out or (with calls waiting) stalls; None: no such event."""
    now = time.monotonic()
    events = []
    for index, started in running.items():
        timeout_s = timeouts[index]
        if timeout_s is not None:
            events.append(started + timeout_s)
        stalls_at = started + stall_after(timeout_s)
        if has_pending and stalls_at > now:  # an already stalled call is no event (no busy loop)
            events.append(stalls_at)
    if not events:
        return None
    return max(min(events) - now, 0.0)
