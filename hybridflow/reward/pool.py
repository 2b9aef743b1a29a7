"""The trainer side of scorer processes: starting them, handing out calls, the kept pool.

A *slot* is one scorer process (set up as ``scorer_process.py`` describes) and the parent end of its
pipe. A slot is *starting* until the process reports ready, then idle or busy with one call.
:func:`run_processes` forks slots for one batch; a :class:`ScorerPool` keeps its slots from
one batch to the next. Either way :func:`~hybridflow.reward.calls.schedule` decides
when calls start and time out; a call sent to a starting slot waits for it to be ready, and
the time it takes to start counts against that call's timeout.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import signal
import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import Any

from hybridflow.reward.calls import ERROR, CallResult, describe, schedule
from hybridflow.reward.custom import CustomRewardFunction
from hybridflow.reward.scorer_process import (
    FAILED,
    READY,
    RESULT,
    SESSION,
    ReadyNotes,
    ScorerSettings,
    scorer_process_main,
)
from hybridflow.utils.errors import InputError

logger = logging.getLogger(__name__)
_warned: set[str] = set()


class ScorerStartError(RuntimeError, InputError):
    """A scorer process could not be made ready: loading the scoring function failed, crashed or
    hung (an input error: the entry points print its message without a traceback)."""


class _SlotLost(Exception):
    """The slot's process is gone."""


@dataclass(eq=False)  # slots are compared by identity
class _Slot:
    process: Any
    conn: Connection
    ready: bool = False
    index: int | None = None  # the call it runs, or will run once ready


def _start_method() -> str:
    return "fork" if "fork" in mp.get_all_start_methods() else "spawn"


def _start_slot(fn: Callable[..., Any], settings: ScorerSettings) -> _Slot:
    # the literal names pick the typed contexts (a plain BaseContext declares no Process)
    ctx = mp.get_context("fork") if _start_method() == "fork" else mp.get_context("spawn")
    parent_conn, child_conn = ctx.Pipe()
    process = ctx.Process(
        target=scorer_process_main, args=(fn, child_conn, os.getpid(), settings), daemon=True, name="hybridflow-reward"
    )
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


def _exit_description(slot: _Slot) -> str:
    slot.process.join(timeout=1.0)
    code = slot.process.exitcode
    if code is not None and code < 0:
        try:
            return f"killed by signal {signal.Signals(-code).name} (exit code {code})"
        except ValueError:
            pass
    return f"exit code {code}"


def _note_ready(notes: ReadyNotes) -> None:
    """Log, once per process, what a scorer process could not set up."""
    for warning in notes.warnings:
        if warning in _warned:
            continue
        _warned.add(warning)
        if notes.isolation == SESSION and warning.startswith("no PID namespace"):
            warning += (
                "; reward scorer processes run in their own session only, so a scorer can still signal the "
                "trainer by its pid"
            )
        logger.warning("reward scorer processes: %s", warning)


class _ProcessRunner:
    """Runs one batch of calls on ``slots`` (updated in place: dead and killed slots removed,
    new ones added)."""

    def __init__(
        self, fn: Callable[..., Any], calls: list[dict[str, Any]], slots: list[_Slot], settings: ScorerSettings
    ):
        self.fn, self.calls, self.slots, self.settings = fn, calls, slots, settings

    def launch(self, index: int) -> CallResult | None:
        for slot in [s for s in self.slots if s.ready and s.index is None]:
            try:
                return self._send(slot, index)
            except _SlotLost:
                continue
        try:
            slot = _start_slot(self.fn, self.settings)
        except OSError as exc:
            return CallResult(ERROR, message=f"could not start a scorer process: {describe(exc)}")
        slot.index = index  # sent once the process is ready
        self.slots.append(slot)
        return None

    def _send(self, slot: _Slot, index: int) -> CallResult | None:
        """Send call ``index`` to a ready slot: None if sent, the failure if the arguments
        cannot be pickled; :class:`_SlotLost` (slot dropped) if its process is gone."""
        try:
            slot.conn.send((index, self.calls[index]))
        except OSError:  # e.g. killed from outside between batches
            self._drop(slot, kill=True)
            raise _SlotLost from None
        except Exception as exc:  # noqa: BLE001 - pickling fails before anything is written
            return CallResult(ERROR, message=f"arguments could not be sent to the scorer: {describe(exc)}")
        slot.index = index
        return None

    def wait(self, timeout: float | None) -> list[tuple[int, CallResult]]:
        busy = [s for s in self.slots if s.index is not None]
        ready = set(wait([s.conn for s in busy], timeout=timeout)) if busy else set()
        done: list[tuple[int, CallResult]] = []
        for slot in busy:
            if slot.conn in ready:
                finished = self._receive(slot)
                if finished is not None:
                    done.append(finished)
        return done

    def _receive(self, slot: _Slot) -> tuple[int, CallResult] | None:
        index = slot.index
        assert index is not None  # only busy slots are waited on
        try:
            message = slot.conn.recv()
        except (EOFError, OSError):
            state = "" if slot.ready else " while loading the scoring function"
            how = _exit_description(slot)  # before _drop, which kills a process still exiting
            self._drop(slot, kill=True)
            return index, CallResult(ERROR, message=f"scorer process died{state} ({how})")
        except Exception as exc:  # noqa: BLE001 - a result that cannot be unpickled here
            slot.index = None
            return index, CallResult(ERROR, message=f"result could not be received: {describe(exc)}")
        kind = _message_kind(message)
        if kind == READY and not slot.ready:
            slot.ready = True
            _note_ready(message[1])
            slot.index = None
            try:
                failure = self._send(slot, index)
            except _SlotLost:
                return index, CallResult(ERROR, message="scorer process died right after it was ready")
            return None if failure is None else (index, failure)
        if kind == FAILED and not slot.ready:
            self._drop(slot, kill=True)
            return index, CallResult(ERROR, message=f"scorer process could not load the scoring function: {message[1]}")
        if kind != RESULT or message[1] != index:
            # only user code in the scorer could have written this: that process is not used again
            self._drop(slot, kill=True)
            return index, CallResult(ERROR, message=f"unexpected message from the scorer process: {message!r:.80}")
        slot.index = None
        return index, message[2]

    def cancel(self, index: int) -> None:
        slot = next((s for s in self.slots if s.index == index), None)
        if slot is not None:
            self._drop(slot, kill=True)

    def _drop(self, slot: _Slot, kill: bool) -> None:
        if slot in self.slots:
            self.slots.remove(slot)
        _stop_slot(slot, kill=kill)


def _message_kind(message: Any) -> str | None:
    """READY / FAILED / RESULT for a well-formed message from a scorer process, else None."""
    if not isinstance(message, tuple) or not message:
        return None
    if message[0] == READY and len(message) == 2 and isinstance(message[1], ReadyNotes):
        return READY
    if message[0] == FAILED and len(message) == 2 and isinstance(message[1], str):
        return FAILED
    if message[0] == RESULT and len(message) == 3 and isinstance(message[2], CallResult):
        return RESULT
    return None


def run_processes(
    fn: Callable[..., Any],
    calls: list[dict[str, Any]],
    timeout_s: float | None,
    num_workers: int,
    settings: ScorerSettings | None = None,
) -> list[CallResult]:
    """Calls spread over scorer processes forked for them (see ``calls.schedule``)."""
    slots: list[_Slot] = []
    try:
        runner = _ProcessRunner(fn, calls, slots, settings or ScorerSettings())
        return schedule(runner, [timeout_s] * len(calls), num_workers)
    finally:
        for slot in slots:
            _stop_slot(slot, kill=slot.index is not None)


class ScorerPool:
    """``num_workers`` scorer processes kept from one batch to the next.

    Forking copies the parent's page tables: a trainer holding SmolLM2's models (5–6 GB) takes
    ~0.1 s to fork and ~0.1 s more to reap the child — on every batch, with :func:`run_processes`.
    The pool forks when it is made, so made before the models load (``hybridflow train`` builds the
    reward managers first) its processes are small and forked once. It waits until each has
    loaded the scoring function, at most ``load_timeout_s``; if one cannot (the file raises,
    exits or hangs at import) it raises :class:`ScorerStartError` saying which. A process that
    hangs past ``timeout_s`` is killed, and one that dies is dropped; fresh forks stand in for
    the rest of that batch (as do the extra processes for stalled calls) and are then stopped,
    because a fork of the loaded trainer, kept, would end up holding a private copy of every
    page the trainer rewrites afterwards (copy-on-write).
    """

    def __init__(
        self,
        fn: Callable[..., Any],
        num_workers: int = 1,
        *,
        load_timeout_s: float | None = None,
        settings: ScorerSettings | None = None,
    ) -> None:
        if num_workers < 1:
            raise ValueError(f"num_workers must be at least 1, got {num_workers}")
        self.fn = fn
        self.num_workers = num_workers
        self.settings = settings or ScorerSettings()
        self._slots = [_start_slot(fn, self.settings) for _ in range(num_workers)]
        self._closer = weakref.finalize(self, _stop_all, self._slots)
        try:
            self.notes = self._wait_ready(load_timeout_s)
        except BaseException:
            self.close()
            raise

    def _wait_ready(self, load_timeout_s: float | None) -> ReadyNotes:
        deadline = None if load_timeout_s is None else time.monotonic() + load_timeout_s
        notes: ReadyNotes | None = None
        starting = list(self._slots)
        while starting:
            left = None if deadline is None else max(deadline - time.monotonic(), 0.0)
            ready = wait([s.conn for s in starting], timeout=left)
            if not ready:
                raise ScorerStartError(
                    f"loading the scoring function {_name(self.fn)} in a scorer process did not finish within "
                    f"{load_timeout_s} s (reward_model.timeout_s)"
                    + _file_hint(self.fn, "does its module-level code hang?")
                )
            for slot in [s for s in starting if s.conn in ready]:
                starting.remove(slot)
                try:
                    message = slot.conn.recv()
                except (EOFError, OSError):
                    raise ScorerStartError(
                        f"loading the scoring function {_name(self.fn)} ended its scorer process "
                        f"({_exit_description(slot)}) before it was ready"
                        + _file_hint(
                            self.fn, "its module-level code ends the process (os._exit, a signal) or crashes it"
                        )
                    ) from None
                kind = _message_kind(message)
                if kind == FAILED:
                    raise ScorerStartError(f"loading the scoring function {_name(self.fn)} failed: {message[1]}")
                if kind != READY:
                    raise ScorerStartError(f"unexpected first message from a scorer process: {message!r:.80}")
                slot.ready = True
                notes = message[1]
                _note_ready(notes)
        assert notes is not None
        return notes

    @property
    def isolation(self) -> str:
        """``"pid-namespace"`` or ``"session"`` (the weaker fallback): see ``scorer_process.py``."""
        return self.notes.isolation

    @property
    def num_alive(self) -> int:
        """Pool processes still kept (the rest were lost to timeouts or crashes)."""
        return len(self._slots)

    @property
    def pids(self) -> list[int]:
        """Process ids (in the trainer's namespace) of the kept processes."""
        return [s.process.pid for s in self._slots]

    def run(self, calls: list[dict[str, Any]], timeout_s: float | None | Sequence[float | None]) -> list[CallResult]:
        """``fn(**kwargs)`` for every call, on the kept processes plus stand-ins; ``timeout_s``
        is one limit for every call or one per call."""
        if not self._closer.alive:
            raise RuntimeError("the scorer pool is closed")
        timeouts = list(timeout_s) if isinstance(timeout_s, Sequence) else [timeout_s] * len(calls)
        if len(timeouts) != len(calls):
            raise ValueError(f"{len(timeouts)} timeouts for {len(calls)} calls")
        slots = list(self._slots)
        try:
            return schedule(_ProcessRunner(self.fn, calls, slots, self.settings), timeouts, self.num_workers)
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
        _stop_slot(slot, kill=not slot.ready)
    slots.clear()


def _file_hint(fn: Callable[..., Any], hint: str) -> str:
    return f": {hint}" if isinstance(fn, CustomRewardFunction) else ""


def _name(fn: Callable[..., Any]) -> str:
    return str(fn) if isinstance(fn, CustomRewardFunction) else getattr(fn, "__qualname__", repr(fn))
