"""The event loop that tool code runs on, apart from the agent loops' own.

``asyncio.wait_for`` cannot stop code that never yields: a tool whose ``async def execute``
does synchronous work (``time.sleep``, a long pure-Python computation, a blocking socket read)
holds the event loop it runs on, and the timer of ``wait_for`` only fires once that work has
returned. So every tool coroutine (``create``, ``execute``, ``release``) runs on one event loop
of its own, in a daemon thread, and :func:`run_on_tool_loop` awaits its result on the caller's
loop with the call's timeout: the agent loop regains control when the timeout fires, whatever
the tool does.

A blocked tool loop is replaced. When a call times out and its task does not end within
:data:`CANCEL_GRACE_S` of being cancelled, synchronous code holds the loop; calls already
waiting on it time out as well, later calls go to a fresh loop, and the old one finishes the
calls it holds, then stops. A tool's ``sys.exit()`` fails its call, not the loop. Python cannot kill a
thread: the blocking code itself runs on until it returns, using its CPU and memory meanwhile.
A tool that runs unbounded or untrusted work must therefore do it in a process with limits (the
python tool's sandbox) or refuse it before starting (the calculator's size limits).

All tools share the tool loop (not one loop per call), so asyncio objects a tool keeps across
calls — a semaphore, an event, a client session — stay on one loop for the process's life.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import os
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

T = TypeVar("T")

# How long a cancelled call may take to end before its loop counts as blocked. A task that
# awaits something ends at once; one that has not ended by then is in synchronous code.
CANCEL_GRACE_S = 0.25
_POLL_S = 0.01


class ToolTimeout(TimeoutError):
    """A tool call did not finish within its timeout (a ``TimeoutError`` the tool raised
    itself is passed on as it is, not as this)."""


class _ToolLoopClosed(RuntimeError):
    """The loop was retired between choosing it and submitting to it; choose again."""


class ToolLoop:
    """One event loop in a daemon thread; calls are counted so a retired loop can end when idle."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.loop = asyncio.new_event_loop()
        self._lock = threading.Lock()
        self._inflight = 0
        self._closing = False
        self._idle = asyncio.Event()
        self._thread = threading.Thread(target=self._serve, name="hybridflow-tools", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_forever()
        finally:
            with self._lock:
                self._closing = True
            self.loop.close()

    def alive(self) -> bool:
        """Whether this loop still takes calls (in this process)."""
        return self.pid == os.getpid() and self._thread.is_alive() and not self._closing

    def submit(self, make: Callable[[], Awaitable[T]]) -> tuple[concurrent.futures.Future[T], threading.Event]:
        """Start ``await make()`` on this loop: (its result, set once its task has ended).

        ``make`` itself is called on the tool loop, so a tool method that does synchronous work
        before returning its awaitable does not run on the caller's loop either. Cancelling the
        returned future cancels the task. The caller's context variables travel with the call.
        """
        with self._lock:
            if self._closing:
                raise _ToolLoopClosed("this tool loop was retired")
            self._inflight += 1
        result: concurrent.futures.Future[T] = concurrent.futures.Future()
        ended = threading.Event()
        context = contextvars.copy_context()

        async def call() -> T:
            try:
                return await make()
            except (SystemExit, KeyboardInterrupt) as exc:  # would end the tool loop's thread, not just this call
                raise RuntimeError(f"{type(exc).__name__}: {exc}") from None

        def start() -> None:
            if result.cancelled():
                self._ended(ended)
                return
            task = self.loop.create_task(call(), context=context)
            task.add_done_callback(lambda done: self._settle(done, result, ended))

            def cancel_task(f: concurrent.futures.Future[T]) -> None:
                if f.cancelled():
                    self._cancel_soon(task)

            result.add_done_callback(cancel_task)

        try:
            self.loop.call_soon_threadsafe(start)
        except RuntimeError:  # the loop closed since the check (its thread ended)
            self._ended(ended)
            raise _ToolLoopClosed("this tool loop has closed") from None
        return result, ended

    def _cancel_soon(self, task: asyncio.Task[Any]) -> None:
        try:
            self.loop.call_soon_threadsafe(task.cancel)
        except RuntimeError:  # the loop has closed: the task is long over
            pass

    def _settle(self, task: asyncio.Task[T], result: concurrent.futures.Future[T], ended: threading.Event) -> None:
        try:
            if task.cancelled():
                result.cancel()
            elif task.exception() is not None:
                result.set_exception(task.exception())
            else:
                result.set_result(task.result())
        except concurrent.futures.InvalidStateError:  # the caller cancelled first
            pass
        self._ended(ended)

    def _ended(self, ended: threading.Event) -> None:
        ended.set()
        with self._lock:
            self._inflight -= 1
            if self._inflight == 0:
                self._idle.set()

    def retire(self) -> None:
        """Take no new calls; stop once the calls this loop holds have ended (the loop may be
        blocked now: the stop is queued behind the blocking code)."""
        drain = self._drain()
        try:
            asyncio.run_coroutine_threadsafe(drain, self.loop)
        except RuntimeError:  # the loop has closed already: nothing left to drain
            drain.close()

    async def _drain(self) -> None:
        while True:
            with self._lock:
                if self._inflight == 0:
                    self._closing = True
                    break
                self._idle.clear()
            await self._idle.wait()
        self.loop.stop()


_current: ToolLoop | None = None
_current_lock = threading.Lock()


def current_tool_loop() -> ToolLoop:
    """The process's tool loop, started on first use (and again in a forked child)."""
    global _current
    with _current_lock:
        if _current is None or not _current.alive():
            _current = ToolLoop()
        return _current


def _replace(blocked: ToolLoop) -> None:
    global _current
    with _current_lock:
        if _current is blocked:
            _current = None
    blocked.retire()


async def run_on_tool_loop(make: Callable[[], Awaitable[T]], timeout_s: float | None) -> T:
    """``await make()`` on the tool loop, bounded by ``timeout_s`` (None: no bound).

    Raises :class:`ToolTimeout` when the time is up — the call is cancelled, and abandoned if
    it cannot be (see the module docstring) — and whatever the call raised otherwise.
    """
    while True:
        tool_loop = current_tool_loop()
        try:
            future, ended = tool_loop.submit(make)
            break
        except _ToolLoopClosed:
            continue
    waiter = asyncio.wrap_future(future)
    try:
        return await asyncio.wait_for(waiter, timeout_s)
    except TimeoutError as exc:
        if future.done() and not future.cancelled() and future.exception() is exc:
            raise  # the tool's own TimeoutError, not the call's timeout
        future.cancel()
        deadline = time.monotonic() + CANCEL_GRACE_S
        while not ended.is_set() and time.monotonic() < deadline:  # noqa: ASYNC110 - a threading.Event, set on the tool loop's thread
            await asyncio.sleep(_POLL_S)
        if not ended.is_set():
            _replace(tool_loop)
        raise ToolTimeout(f"the call did not finish within {timeout_s:g} s") from None
