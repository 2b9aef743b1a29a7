"""How strongly a run is isolated, detected once per process.

Two levels, strongest first:

* ``bwrap`` — bubblewrap (the ``bubblewrap`` Debian package): new user, PID, network, IPC and
  UTS namespaces; a root file system of read-only ``/usr`` and the Python installation only
  (no ``/home``, ``/root``, ``/etc`` or host ``/tmp``); a private, size-capped tmpfs as the
  working directory and ``/tmp``; all capabilities dropped; killed with its parent. Every
  process the code starts dies with the run (the PID namespace ends with it).
* ``rlimits`` — a plain child process in its own session, an empty temporary directory, a
  cleared environment and the same resource limits. It isolates crashes and runaway
  resource use, not hostile code: the code can read what the user can, open sockets and
  write where the user can.

Both levels apply :class:`~hybridflow.sandbox.limits.SandboxLimits` with rlimits. When the
process runs as root, the bwrap level runs the code under a uid of its own (so
``RLIMIT_NPROC`` counts only that run's processes and file permissions apply); see
docs/sandbox.md for what each level guarantees.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from hybridflow.utils.errors import InputError

BWRAP = "bwrap"
RLIMITS = "rlimits"
LEVELS: tuple[str, ...] = (BWRAP, RLIMITS)  # strongest first
SANDBOX_WORKDIR = "/sandbox"


class IsolationError(InputError, RuntimeError):
    """The isolation a caller requires is not available here."""


@dataclass(frozen=True)
class Isolation:
    """The detected level and why (the reason a stronger one was not used)."""

    level: str
    detail: str

    @property
    def strong(self) -> bool:
        return self.level == BWRAP

    def line(self) -> str:
        return f"sandbox isolation: {self.level} ({self.detail})"


def python_paths() -> tuple[str, str]:
    """``(interpreter, installation prefix)`` of the base Python (not a virtualenv's)."""
    prefix = os.path.realpath(sys.base_prefix)
    for name in (f"python{sys.version_info.major}.{sys.version_info.minor}", f"python{sys.version_info.major}", "python"):
        candidate = os.path.join(prefix, "bin", name)
        if os.access(candidate, os.X_OK):
            return candidate, prefix
    real = os.path.realpath(sys.executable)
    return real, prefix


def bwrap_arguments(workdir_size: int, *, as_root: bool) -> list[str]:
    """bubblewrap's options for one run (the command follows after ``--``)."""
    _, prefix = python_paths()
    args = [BWRAP, "--die-with-parent", "--new-session", "--clearenv"]
    if as_root:  # no user namespace: the launcher switches to a real uid of the run's own
        args += ["--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts", "--unshare-cgroup-try"]
    else:
        args += ["--unshare-all"]  # user, ipc, pid, net, uts, cgroup
    args += ["--ro-bind", "/usr", "/usr"]
    for name in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
        path = f"/{name}"
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            args += ["--ro-bind", path, path]
    if not prefix.startswith("/usr/"):
        parents = Path(prefix).parents
        for parent in reversed([p for p in parents if str(p) != "/"]):
            args += ["--perms", "0755", "--dir", str(parent)]  # bubblewrap would make them 0700
        args += ["--ro-bind", prefix, prefix]
    args += ["--perms", "0755", "--dir", "/etc", "--ro-bind-try", "/etc/ld.so.cache", "/etc/ld.so.cache"]
    args += ["--proc", "/proc", "--dev", "/dev"]
    args += ["--perms", "1777", "--size", str(workdir_size), "--tmpfs", "/tmp"]
    args += ["--perms", "0700", "--size", str(workdir_size), "--tmpfs", SANDBOX_WORKDIR]
    args += ["--setenv", "PATH", "/usr/local/bin:/usr/bin:/bin", "--setenv", "HOME", SANDBOX_WORKDIR,
             "--setenv", "LANG", "C.UTF-8", "--chdir", SANDBOX_WORKDIR]
    if as_root:  # the launcher needs these three to hand the workdir to the run's uid and switch to it
        args += ["--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID", "--cap-add", "CAP_CHOWN"]
    return args + ["--"]


@lru_cache(maxsize=1)
def detect_isolation() -> Isolation:
    """The strongest level that works here: bubblewrap is tried with a real command."""
    path = shutil.which(BWRAP)
    if path is None:
        return Isolation(RLIMITS, "bubblewrap is not installed (Debian/Ubuntu: apt-get install bubblewrap)")
    python, _ = python_paths()
    probe = [*bwrap_arguments(1 << 20, as_root=os.geteuid() == 0), python, "-I", "-S", "-c", "print('ok')"]
    try:
        out = subprocess.run(probe, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return Isolation(RLIMITS, f"bubblewrap is installed but did not start: {exc}")
    if out.returncode != 0 or out.stdout.strip() != "ok":
        reason = (out.stderr.strip().splitlines() or ["no output"])[-1]
        return Isolation(RLIMITS, f"bubblewrap is installed but cannot create namespaces here: {reason}")
    return Isolation(BWRAP, f"bubblewrap at {path}: namespaces, read-only system, private tmpfs workdir, no network")


def require_isolation(allow_weak: bool, what: str) -> Isolation:
    """The detected isolation, or :class:`IsolationError` when it is weak and ``allow_weak`` is off."""
    isolation = detect_isolation()
    if not isolation.strong and not allow_weak:
        raise IsolationError(
            f"{what} runs untrusted code, and the strongest sandbox here is '{isolation.level}': "
            f"{isolation.detail}. Install bubblewrap, or accept process-level isolation explicitly "
            "(allow_weak_isolation=true / --allow-weak-isolation)."
        )
    return isolation
