"""Run a program in the sandbox: :func:`run_code` → :class:`RunResult`.

One run: a fresh process tree under the detected isolation (:mod:`.isolation`) with the
limits of :class:`~hybridflow.sandbox.limits.SandboxLimits`. The program arrives on the
launcher's stdin (:mod:`._launcher`) followed by the program's own stdin; stdout and stderr are
read separately, each capped. When the wall clock, the CPU limit or an output cap is passed,
the whole run is killed (its process group; under bubblewrap its PID namespace with it).

Verdicts (``RunResult.status``), named as Sandbox Fusion names them where it has a name:

* ``Finished`` — the program ended by itself (``return_code`` says how: 0, an exit status, or
  ``-signal``; a ``MemoryError`` or a failed fork shows up here as a non-zero status);
* ``TimeLimitExceeded`` — killed at ``wall_s``, or by the CPU limit (SIGXCPU);
* ``OutputLimitExceeded`` — killed because stdout or stderr passed ``max_output_bytes``;
* ``SandboxError`` — the sandbox itself could not start the program (``stderr`` says why).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from hybridflow.sandbox.isolation import (
    BWRAP,
    SANDBOX_WORKDIR,
    Isolation,
    bwrap_arguments,
    can_switch_uid,
    detect_isolation,
    python_paths,
)
from hybridflow.sandbox.limits import SandboxLimits

FINISHED = "Finished"
TIME_LIMIT = "TimeLimitExceeded"
OUTPUT_LIMIT = "OutputLimitExceeded"
SANDBOX_ERROR = "SandboxError"
_LAUNCHER_SOURCE = (Path(__file__).parent / "_launcher.py").read_text()
RUN_UID_BASE = 1_900_000_000  # root runs each concurrent program under its own uid from here


@dataclass
class RunResult:
    """What one run did; ``execution_time`` is wall seconds."""

    status: str
    return_code: int | None
    stdout: str
    stderr: str
    execution_time: float
    isolation: str

    @property
    def passed(self) -> bool:
        """Finished with exit status 0."""
        return self.status == FINISHED and self.return_code == 0


class _UidPool:
    """Distinct uids for concurrent runs, so ``RLIMIT_NPROC`` counts one run's processes only."""

    def __init__(self, base: int) -> None:
        self._base, self._next = base, 0
        self._free: list[int] = []
        self._lock = threading.Lock()

    def take(self) -> int:
        with self._lock:
            if self._free:
                return self._free.pop()
            self._next += 1
            return self._base + self._next - 1

    def give(self, uid: int) -> None:
        with self._lock:
            self._free.append(uid)


_UIDS = _UidPool(RUN_UID_BASE)


def _processes_of(uid: int) -> int:
    count = 0
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                count += entry.stat().st_uid == uid
            except OSError:
                pass
    return count


def _rlimits(limits: SandboxLimits, nproc: int) -> dict[str, tuple[int, int]]:
    """(soft, hard) per limit. CPU: SIGXCPU at the soft limit (a verdict we can name), SIGKILL a
    second later for a program that catches it."""
    memory = limits.memory_mb << 20
    return {
        "RLIMIT_AS": (memory, memory),
        "RLIMIT_CPU": (limits.cpu_seconds, limits.cpu_seconds + 1),
        "RLIMIT_NPROC": (nproc, nproc),
        "RLIMIT_FSIZE": (limits.max_file_bytes, limits.max_file_bytes),
        "RLIMIT_CORE": (0, 0),
        "RLIMIT_NOFILE": (256, 256),
    }


def _kill(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


async def run_code(
    code: str,
    *,
    stdin: str = "",
    files: dict[str, str] | None = None,
    limits: SandboxLimits = SandboxLimits(),
    isolation: Isolation | None = None,
) -> RunResult:
    """Run the Python program ``code`` (as ``main.py``) with ``stdin``; ``files`` (relative path →
    base64 content) are written beside it first. See the module docstring."""
    isolation = isolation or detect_isolation()
    python, _ = python_paths()
    as_root = can_switch_uid()
    uid = _UIDS.take() if as_root and isolation.level == BWRAP else None
    started = time.perf_counter()
    try:
        with tempfile.TemporaryDirectory(prefix="hybridflow-sandbox-") as host_dir:
            if isolation.level == BWRAP:
                workdir, prefix = SANDBOX_WORKDIR, bwrap_arguments(limits.max_file_bytes, as_root=as_root)
                env = None  # bubblewrap clears and sets it
            else:
                workdir, prefix = host_dir, []
                env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": host_dir, "LANG": "C.UTF-8"}
            # NPROC counts every process of the uid: a run's own uid starts at 0, the user's does not
            nproc = limits.max_processes + (0 if uid is not None else _processes_of(os.getuid()))
            settings = {"workdir": workdir, "python": python, "uid": uid, "rlimits": _rlimits(limits, nproc)}
            command = [*prefix, python, "-I", "-S", "-u", "-c", _LAUNCHER_SOURCE, json.dumps(settings)]
            job = json.dumps({"code": code, "files": dict(files or {})}).encode("utf-8")
            payload = f"{len(job)}\n".encode() + job + stdin.encode("utf-8")
            return await _run(command, payload, env, host_dir, limits, isolation, started)
    finally:
        if uid is not None:
            _UIDS.give(uid)


async def _run(
    command: list[str],
    payload: bytes,
    env: dict | None,
    cwd: str,
    limits: SandboxLimits,
    isolation: Isolation,
    started: float,
) -> RunResult:
    try:
        proc = await asyncio.create_subprocess_exec(
            *command,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            cwd=cwd,
            env=env,
            start_new_session=True,
        )
    except OSError as exc:
        return RunResult(SANDBOX_ERROR, None, "", f"the sandbox could not start: {exc}", 0.0, isolation.level)
    streams, over, timed_out = await _exchange(proc, payload, limits)
    return_code = await proc.wait()
    transport = getattr(proc, "_transport", None)  # asyncio has no public close for a Process's pipes
    if transport is not None:
        transport.close()
    stdout = bytes(streams["stdout"][: limits.max_output_bytes]).decode("utf-8", errors="replace")
    stderr = bytes(streams["stderr"][: limits.max_output_bytes]).decode("utf-8", errors="replace")
    return _verdict(
        return_code,
        stdout,
        stderr,
        over[0] if over else None,
        timed_out,
        limits,
        isolation,
        time.perf_counter() - started,
    )


async def _exchange(
    proc: asyncio.subprocess.Process, payload: bytes, limits: SandboxLimits
) -> tuple[dict[str, bytearray], list[str], bool]:
    """Feed ``payload`` to the program and read its output until it ends, the clock runs out or
    a stream passes its cap; then kill its process group. Returns ``(streams, over, timed_out)``:
    the bytes read per stream, the streams that passed the cap, whether the clock ran out."""
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    stdin = proc.stdin  # narrowed above; the closure below sees the local
    streams = {"stdout": bytearray(), "stderr": bytearray()}
    over: list[str] = []

    async def feed() -> None:
        try:
            stdin.write(payload)
            await stdin.drain()
        except (BrokenPipeError, ConnectionResetError):
            pass
        finally:
            stdin.close()

    async def read(name: str, stream: asyncio.StreamReader) -> None:
        buffer = streams[name]
        while chunk := await stream.read(1 << 16):
            buffer.extend(chunk)
            if len(buffer) > limits.max_output_bytes:
                over.append(name)
                _kill(proc.pid)
                return

    tasks = [asyncio.ensure_future(t) for t in (feed(), read("stdout", proc.stdout), read("stderr", proc.stderr))]
    timed_out = False
    try:
        await asyncio.wait_for(asyncio.gather(*tasks[1:]), limits.wall_s)
    except TimeoutError:
        timed_out = True
    _kill(proc.pid)
    # the pipes reach EOF once every process holding them is gone; one that escaped the kill
    # (possible only without bubblewrap) must not hold the caller
    _, pending = await asyncio.wait(tasks, timeout=1.0)
    for task in pending:
        task.cancel()
    return streams, over, timed_out


def _verdict(
    return_code: int,
    stdout: str,
    stderr: str,
    over: str | None,
    timed_out: bool,
    limits: SandboxLimits,
    isolation: Isolation,
    elapsed: float,
) -> RunResult:
    """Name what ended the run (module docstring): a cap, the clock, the CPU limit, the sandbox, or the program."""
    if over is not None:
        return RunResult(
            OUTPUT_LIMIT,
            None,
            stdout,
            stderr + f"\n[stopped: {over} passed {limits.max_output_bytes} bytes]",
            elapsed,
            isolation.level,
        )
    if timed_out:
        return RunResult(
            TIME_LIMIT,
            None,
            stdout,
            stderr + f"\n[stopped: did not finish within {limits.wall_s:g} s]",
            elapsed,
            isolation.level,
        )
    if return_code in (-signal.SIGXCPU, 128 + signal.SIGXCPU):
        return RunResult(
            TIME_LIMIT,
            return_code,
            stdout,
            stderr + f"\n[stopped: CPU time limit of {limits.cpu_seconds} s]",
            elapsed,
            isolation.level,
        )
    if isolation.level == BWRAP and return_code == 1 and stderr.startswith("bwrap:"):
        return RunResult(SANDBOX_ERROR, None, stdout, stderr, elapsed, isolation.level)
    return RunResult(FINISHED, return_code, stdout, stderr, elapsed, isolation.level)


def describe_limits(limits: SandboxLimits) -> str:
    return (
        f"wall {limits.wall_s:g} s, CPU {limits.cpu_seconds} s, memory {limits.memory_mb} MB, "
        f"{limits.max_processes} processes, output {limits.max_output_bytes} B, files {limits.max_file_bytes} B"
    )


__all__ = ["RunResult", "run_code", "describe_limits", "FINISHED", "TIME_LIMIT", "OUTPUT_LIMIT", "SANDBOX_ERROR"]
