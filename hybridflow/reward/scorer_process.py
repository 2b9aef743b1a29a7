"""The scorer process side: isolation from the trainer, a memory cap, loading, the call loop.

A scorer process (made by ``pool.py`` with ``fork``, or ``spawn`` where there is no fork) sets
itself up before it runs any user code:

1. **Own PID namespace** (Linux, where unprivileged user namespaces are allowed): the process
   calls ``unshare(CLONE_NEWUSER | CLONE_NEWPID)`` and forks; the fork is PID 1 of a new PID
   namespace and does the scoring. The trainer's PID does not exist there, so ``kill`` cannot
   reach it (``os.getppid()`` is 0; ``kill(0, …)`` reaches only the scorer's own group). The
   process in between stays outside as a *nanny*: it waits for the scorer, mirrors its exit
   status, and kills it if the trainer goes away; the scorer dies with the nanny
   (``PR_SET_PDEATHSIG``), so killing the nanny on a timeout stops the scorer and anything it
   started. Where ``unshare`` is refused (containers' seccomp, AppArmor, a disabled sysctl,
   macOS) the process scores itself, in its own session only — a scorer can then still
   signal the trainer by its pid — and says so in its ready message (the pool logs it once).
   This is not a security sandbox: same uid, same files.
2. **Own session** (``setsid``): not in the trainer's process group, so neither a group
   signal from the scorer nor the terminal's Ctrl-C links the two.
3. **Memory cap**: ``RLIMIT_AS`` (soft and hard) at the address space the process already
   has plus ``memory_limit_mb``; an allocation beyond it raises ``MemoryError`` in the scorer,
   which becomes that item's error. Counting from the inherited size keeps the cap meaningful
   for forks of a trainer with a large address space.
4. **Loading**: a :class:`~hybridflow.reward.custom.CustomRewardFunction` is imported
   here, so its module-level code runs in the scorer, under the cap.

Then it sends ``("ready", notes)`` (or ``("failed", message)`` and exits) and serves
``(index, kwargs)`` calls with ``("result", index, CallResult)`` until it receives ``None``.
"""

from __future__ import annotations

import ctypes
import os
import select
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

from hybridflow.reward.calls import ERROR, CallResult, call_safely, describe
from hybridflow.reward.custom import CustomRewardFunction

DEFAULT_MEMORY_LIMIT_MB = 4096  # = reward_model.memory_limit_mb default
PID_NAMESPACE, SESSION = "pid-namespace", "session"
READY, FAILED, RESULT = "ready", "failed", "result"

_CLONE_NEWUSER = 0x10000000
_CLONE_NEWPID = 0x20000000
_PR_SET_PDEATHSIG = 1


@dataclass(frozen=True)
class ScorerSettings:
    """How scorer processes are set up: ``memory_limit_mb`` (None or 0: no cap), and whether
    to try a PID namespace (``isolate``)."""

    memory_limit_mb: int | None = DEFAULT_MEMORY_LIMIT_MB
    isolate: bool = True


@dataclass(frozen=True)
class ReadyNotes:
    """What a scorer process reports once it is ready: its isolation and any limit not applied."""

    isolation: str
    warnings: tuple[str, ...] = ()


def _libc_function(name: str) -> Any:
    try:
        return getattr(ctypes.CDLL(None, use_errno=True), name)
    except (AttributeError, OSError):
        return None


# Looked up here, in the trainer: a fork of a multithreaded process should not enter the
# dynamic loader (its lock may have been held by another thread at the fork).
_UNSHARE = _libc_function("unshare") if sys.platform.startswith("linux") else None
_PRCTL = _libc_function("prctl") if sys.platform.startswith("linux") else None


def unshare(flags: int) -> None:
    """``unshare(2)`` (Python 3.11 has no ``os.unshare``); ``OSError`` when refused."""
    if _UNSHARE is None:
        raise OSError(f"no unshare(2) on {sys.platform}")
    if _UNSHARE(ctypes.c_int(flags)) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"unshare(CLONE_NEWUSER | CLONE_NEWPID): {os.strerror(errno)}")


def _map_own_ids(uid: int, gid: int) -> None:
    # Inside a new user namespace the ids are unmapped (shown as 65534) until mapped; mapping
    # our own uid/gid (read before unshare) to themselves keeps getuid(), file ownership and
    # home lookups as before.
    try:
        with open("/proc/self/uid_map", "w") as f:
            f.write(f"{uid} {uid} 1")
        with open("/proc/self/setgroups", "w") as f:
            f.write("deny")
        with open("/proc/self/gid_map", "w") as f:
            f.write(f"{gid} {gid} 1")
    except OSError:
        pass  # unmapped ids only change what the scorer sees of itself, not what it may access


def scorer_process_main(fn: Callable[..., Any], conn: Connection, parent_pid: int, settings: ScorerSettings) -> None:
    """Entry point of a scorer process (the target of ``multiprocessing.Process``)."""
    reason = "isolation turned off"
    if settings.isolate:
        uid, gid = os.getuid(), os.getgid()
        try:
            unshare(_CLONE_NEWUSER | _CLONE_NEWPID)
        except OSError as exc:
            reason = str(exc)
        else:
            _map_own_ids(uid, gid)
            lifeline_r, lifeline_w = os.pipe()
            try:
                child = os.fork()
            except OSError as exc:
                os.close(lifeline_r)
                os.close(lifeline_w)
                reason = f"fork into the new PID namespace failed: {exc}"
            else:
                if child == 0:
                    os.close(lifeline_w)
                    _run_in_namespace(fn, conn, settings, lifeline_r)
                os.close(lifeline_r)
                conn.close()  # the scorer holds the only child end: its exit is EOF for the trainer
                _nanny(child, parent_pid)
    _run_scorer(fn, conn, settings, ReadyNotes(SESSION, (f"no PID namespace ({reason})",)), parent_pid)


def _run_in_namespace(fn: Callable[..., Any], conn: Connection, settings: ScorerSettings, lifeline: int) -> None:
    try:
        if _PRCTL is None or _PRCTL(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) != 0:
            os._exit(1)  # without it a killed nanny would leave the scorer running
        # The nanny may have died before prctl: its end of the lifeline is then closed.
        if select.select([lifeline], [], [], 0)[0]:
            os._exit(1)
        _run_scorer(fn, conn, settings, ReadyNotes(PID_NAMESPACE), parent_pid=None)
    finally:
        os._exit(1)  # never return into the nanny's code


def _nanny(child: int, parent_pid: int) -> None:
    """Wait for the scorer; kill it if the trainer goes away; exit as it did."""
    # The nanny stays in the trainer's process group: a Ctrl-C meant for the trainer must not
    # end it (and so the scorer) mid-batch; the trainer stops its scorers itself.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        pidfd = os.pidfd_open(child)
    except (AttributeError, OSError):
        pidfd = None
    while True:
        if pidfd is not None:
            select.select([pidfd], [], [], 1.0)
        else:
            time.sleep(0.05)
        done, status = os.waitpid(child, os.WNOHANG)
        if done:
            break
        if os.getppid() != parent_pid:
            os.kill(child, signal.SIGKILL)
            _, status = os.waitpid(child, 0)
            break
    code = os.waitstatus_to_exitcode(status)
    if code < 0:  # die of the same signal, so the trainer reads the same exit code
        try:
            signal.signal(-code, signal.SIG_DFL)
        except (OSError, ValueError):
            pass  # SIGKILL / SIGSTOP: their action cannot be changed (and is already the default)
        os.kill(os.getpid(), -code)
        code = 128 - code  # a signal whose default is to be ignored: exit as a shell would report it
    os._exit(code)


def apply_memory_limit(limit_mb: int | None) -> str | None:
    """Cap the address space at its current size + ``limit_mb`` MiB; a warning if that failed."""
    if not limit_mb:
        return None
    try:
        import resource

        current = _address_space_bytes()
        cap = current + limit_mb * 2**20
        _, hard = resource.getrlimit(resource.RLIMIT_AS)
        if hard != resource.RLIM_INFINITY:
            cap = min(cap, hard)
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    except (ImportError, OSError, ValueError) as exc:
        return f"memory_limit_mb={limit_mb} not applied: {describe(exc)}"
    return None


def _address_space_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    raise OSError("no VmSize in /proc/self/status")


def _run_scorer(
    fn: Callable[..., Any], conn: Connection, settings: ScorerSettings, notes: ReadyNotes, parent_pid: int | None
) -> None:
    try:
        os.setsid()
    except OSError:
        pass  # EPERM: it already leads its own process group, so it is not in the trainer's
    warning = apply_memory_limit(settings.memory_limit_mb)
    if warning is not None:
        notes = ReadyNotes(notes.isolation, (*notes.warnings, warning))
    try:
        if isinstance(fn, CustomRewardFunction):
            fn = fn.load()
    except BaseException as exc:  # noqa: BLE001 - anything the file's module-level code raises
        conn.send((FAILED, describe(exc)))
        os._exit(1)
    conn.send((READY, notes))
    _serve(fn, conn, parent_pid, settings.memory_limit_mb)
    os._exit(0)


def _serve(fn: Callable[..., Any], conn: Connection, parent_pid: int | None, memory_limit_mb: int | None) -> None:
    """Receive ``(index, kwargs)``, send back ``("result", index, CallResult)``; ``None`` stops.

    Sibling processes hold copies of this pipe's parent end (fork duplicates descriptors), so
    a vanished trainer may not show as EOF: without a nanny, the loop also checks its parent.
    """
    while True:
        try:
            if not conn.poll(1.0):
                if parent_pid is not None and os.getppid() != parent_pid:
                    return
                continue
            message = conn.recv()
        except (EOFError, OSError):
            return
        if message is None:
            return
        index, kwargs = message
        result = call_safely(fn, kwargs)
        if result.status == ERROR and result.message.startswith("MemoryError") and memory_limit_mb:
            result = CallResult(
                ERROR,
                message=f"{result.message} (scorer processes may add {memory_limit_mb} MiB: "
                "reward_model.memory_limit_mb)",
            )
        try:
            conn.send((RESULT, index, result))
        except Exception as exc:  # noqa: BLE001 - e.g. an unpicklable result
            conn.send((RESULT, index, CallResult(ERROR, message=f"result could not be sent back: {describe(exc)}")))
