"""Run scoring calls with fault containment: exceptions and hangs become per-call results.

Three executors, behind the ``EXECUTORS`` registry:

* ``process`` (default) — forked worker processes (``num_workers`` of them) take calls one at
  a time; a call running past ``timeout_s`` gets its process killed and a fresh one started.
  A hang is truly stopped and a crash (segfault, ``os._exit``) is contained. Needs picklable
  arguments and results. :func:`run_processes` forks per batch; a :class:`ScorerPool` keeps
  its processes across batches (what the reward managers use). Where ``fork`` is not
  available (macOS, Windows) ``spawn`` is used, which also needs an importable scoring function.
* ``thread`` — each call in a daemon thread; a call past ``timeout_s`` is abandoned but keeps
  running in the background (Python cannot kill a thread), so a scorer stuck in a busy loop
  keeps burning a core. Use it only for scorers that cannot be forked.
* ``inline`` — plain calls in this process: exceptions are contained, hangs are not, so it
  refuses a ``timeout_s``.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from typing import Any

from hybridflow.utils.registry import Registry

OK, ERROR, TIMEOUT = "ok", "error", "timeout"


@dataclass(frozen=True)
class CallResult:
    """What one call produced: ``status`` is ``ok`` (``value`` set), ``error`` or ``timeout`` (``message`` set)."""

    status: str
    value: Any = None
    message: str = ""


Executor = Callable[[Callable[..., Any], list[dict[str, Any]], "float | None", int], list[CallResult]]
EXECUTORS: Registry[Executor] = Registry("reward executor")


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def _call(fn: Callable[..., Any], kwargs: dict[str, Any]) -> CallResult:
    try:
        return CallResult(OK, fn(**kwargs))
    except (Exception, SystemExit) as exc:  # KeyboardInterrupt still stops the run
        return CallResult(ERROR, message=_describe(exc))


@EXECUTORS.register("inline")
def run_inline(fn: Callable[..., Any], calls: list[dict[str, Any]], timeout_s: float | None, num_workers: int) -> list[CallResult]:
    """Call ``fn(**kwargs)`` for each call in order, here."""
    if timeout_s is not None:
        raise ValueError("the inline reward executor cannot enforce timeout_s; use 'process' or 'thread'")
    return [_call(fn, kwargs) for kwargs in calls]


@EXECUTORS.register("thread")
def run_threads(fn: Callable[..., Any], calls: list[dict[str, Any]], timeout_s: float | None, num_workers: int) -> list[CallResult]:
    """Up to ``num_workers`` calls at a time in daemon threads; late calls are abandoned as timeouts."""
    results: list[CallResult] = []
    for start in range(0, len(calls), num_workers):
        chunk = calls[start : start + num_workers]
        boxes: list[list[CallResult]] = [[] for _ in chunk]
        threads = [
            threading.Thread(target=lambda b=box, kw=kwargs: b.append(_call(fn, kw)), daemon=True)
            for box, kwargs in zip(boxes, chunk)
        ]
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        for thread in threads:
            thread.start()
        for thread, box in zip(threads, boxes):
            thread.join(None if deadline is None else max(deadline - time.monotonic(), 0.0))
            results.append(box[0] if box else CallResult(TIMEOUT, message=f"no result within timeout_s={timeout_s}"))
    return results


def _process_worker(fn: Callable[..., Any], conn: Connection, parent_pid: int) -> None:
    """Child loop: receive ``(index, kwargs)``, send back ``(index, CallResult)``; ``None`` stops.

    Sibling workers hold copies of this pipe's parent end (fork duplicates descriptors), so
    a vanished parent may not show as EOF: the loop also checks who its parent is.
    """
    while True:
        try:
            if not conn.poll(1.0):
                if os.getppid() != parent_pid:
                    return
                continue
            message = conn.recv()
        except (EOFError, OSError):
            return
        if message is None:
            return
        index, kwargs = message
        result = _call(fn, kwargs)
        try:
            conn.send((index, result))
        except Exception as exc:  # noqa: BLE001 - e.g. an unpicklable result
            conn.send((index, CallResult(ERROR, message=f"result could not be sent back: {_describe(exc)}")))


@dataclass(eq=False)  # slots are compared by identity
class _Slot:
    process: Any
    conn: Connection
    index: int | None = None
    started: float = field(default=0.0)


def _start_method() -> str:
    return "fork" if "fork" in mp.get_all_start_methods() else "spawn"


def _start_slot(fn: Callable[..., Any]) -> _Slot:
    ctx = mp.get_context(_start_method())
    parent_conn, child_conn = ctx.Pipe()
    process = ctx.Process(target=_process_worker, args=(fn, child_conn, os.getpid()), daemon=True, name="hybridflow-reward")
    process.start()
    child_conn.close()
    return _Slot(process, parent_conn)


def _stop_slot(slot: _Slot, kill: bool) -> None:
    if not kill:
        try:
            slot.conn.send(None)
        except (OSError, ValueError):
            kill = True
        slot.process.join(timeout=2.0)
    if slot.process.is_alive():
        slot.process.kill()
        slot.process.join()
    slot.conn.close()


@EXECUTORS.register("process")
def run_processes(fn: Callable[..., Any], calls: list[dict[str, Any]], timeout_s: float | None, num_workers: int) -> list[CallResult]:
    """Calls spread over ``num_workers`` worker processes forked for them; see the module docstring."""
    slots: list[_Slot] = []
    try:
        return _run_on_slots(fn, calls, timeout_s, num_workers, slots)
    finally:
        for slot in slots:
            _stop_slot(slot, kill=slot.index is not None)


class ScorerPool:
    """``num_workers`` scoring processes kept from one batch to the next.

    Forking copies the parent's page tables: a trainer holding SmolLM2's models (5–6 GB) takes
    ~0.1 s to fork and ~0.1 s more to reap the child — on every batch, with :func:`run_processes`.
    The pool forks when it is made, so made before the models load (``main_ppo`` builds the
    reward managers first) its processes are small and forked once. A process that hangs past
    ``timeout_s`` is killed, and one that dies is dropped; a fresh fork stands in for the rest
    of that batch and is then stopped, because a fork of the loaded trainer, kept, would end up
    holding a private copy of every page the trainer rewrites afterwards (copy-on-write).
    """

    def __init__(self, fn: Callable[..., Any], num_workers: int = 1) -> None:
        if num_workers < 1:
            raise ValueError(f"num_workers must be at least 1, got {num_workers}")
        self.fn = fn
        self.num_workers = num_workers
        self._slots = [_start_slot(fn) for _ in range(num_workers)]
        self._closer = weakref.finalize(self, _stop_all, self._slots)

    @property
    def num_alive(self) -> int:
        """Pool processes still kept (the rest were lost to timeouts or crashes)."""
        return len(self._slots)

    def run(self, calls: list[dict[str, Any]], timeout_s: float | None) -> list[CallResult]:
        """``fn(**kwargs)`` for every call, as :func:`run_processes` does, on the kept processes."""
        if not self._closer.alive:
            raise RuntimeError("the scorer pool is closed")
        slots = list(self._slots)
        try:
            return _run_on_slots(self.fn, calls, timeout_s, self.num_workers, slots)
        finally:
            kept = [s for s in slots if s in self._slots and s.index is None]
            for slot in slots:
                if slot not in kept:
                    _stop_slot(slot, kill=slot.index is not None)
            self._slots[:] = kept

    def close(self) -> None:
        """Stop the pool's processes (also done when the pool is garbage-collected)."""
        self._closer()


def _stop_all(slots: list[_Slot]) -> None:
    for slot in slots:
        _stop_slot(slot, kill=False)
    slots.clear()


def _run_on_slots(
    fn: Callable[..., Any], calls: list[dict[str, Any]], timeout_s: float | None, num_workers: int, slots: list[_Slot]
) -> list[CallResult]:
    """Run ``calls`` on idle ``slots``, forking new ones up to ``num_workers``; ``slots`` is
    updated in place (killed and dead processes removed, new ones added)."""
    results: list[CallResult | None] = [None] * len(calls)
    pending = deque(range(len(calls)))
    while pending or any(s.index is not None for s in slots):
        _assign(fn, calls, pending, slots, num_workers, results)
        busy = [s for s in slots if s.index is not None]
        if not busy:
            continue
        ready = wait([s.conn for s in busy], timeout=_time_left(busy, timeout_s))
        for slot in busy:
            if slot.conn in ready:
                _collect(slot, slots, results)
            elif timeout_s is not None and time.monotonic() - slot.started >= timeout_s:
                results[slot.index] = CallResult(TIMEOUT, message=f"no result within timeout_s={timeout_s}")
                slots.remove(slot)
                _stop_slot(slot, kill=True)
    return [r if r is not None else CallResult(ERROR, message="no result") for r in results]


def _assign(fn, calls, pending: deque, slots: list[_Slot], num_workers: int, results: list) -> None:
    """Hand pending calls to idle slots, starting processes up to ``num_workers``."""
    while pending:
        idle = next((s for s in slots if s.index is None), None)
        if idle is None:
            if len(slots) >= num_workers:
                return
            idle = _start_slot(fn)
            slots.append(idle)
        index = pending.popleft()
        try:
            idle.conn.send((index, calls[index]))
        except Exception as exc:  # noqa: BLE001 - unpicklable arguments
            results[index] = CallResult(ERROR, message=f"arguments could not be sent to the scorer: {_describe(exc)}")
            continue
        idle.index, idle.started = index, time.monotonic()


def _collect(slot: _Slot, slots: list[_Slot], results: list) -> None:
    try:
        index, result = slot.conn.recv()
    except (EOFError, OSError):
        slot.process.join(timeout=1.0)
        results[slot.index] = CallResult(
            ERROR, message=f"scorer process died (exit code {slot.process.exitcode})"
        )
        slots.remove(slot)
        _stop_slot(slot, kill=True)
        return
    results[index] = result
    slot.index = None


def _time_left(busy: list[_Slot], timeout_s: float | None) -> float | None:
    if timeout_s is None:
        return None
    now = time.monotonic()
    return max(min(s.started + timeout_s - now for s in busy), 0.0)


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
