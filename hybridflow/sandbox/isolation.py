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

import logging
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from hybridflow.utils.booleans import parse_bool
from hybridflow.utils.errors import InputError

logger = logging.getLogger(__name__)

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


def can_switch_uid() -> bool:
    """True for root in the initial user namespace: it may run code under any uid. Root inside a
    user namespace (e.g. a reward scorer process) maps too few uids for that."""
    if os.geteuid() != 0:
        return False
    try:
        first = open("/proc/self/uid_map").read().split()
    except OSError:
        return False
    return first[:3] == ["0", "0", "4294967295"]


def python_paths() -> tuple[str, str]:
    """``(interpreter, installation prefix)`` of the base Python (not a virtualenv's)."""
    prefix = os.path.realpath(sys.base_prefix)
    for name in (
        f"python{sys.version_info.major}.{sys.version_info.minor}",
        f"python{sys.version_info.major}",
        "python",
    ):
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
    args += [
        "--setenv",
        "PATH",
        "/usr/local/bin:/usr/bin:/bin",
        "--setenv",
        "HOME",
        SANDBOX_WORKDIR,
        "--setenv",
        "LANG",
        "C.UTF-8",
        "--chdir",
        SANDBOX_WORKDIR,
    ]
    if as_root:  # the launcher needs these three to hand the workdir to the run's uid and switch to it
        args += ["--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID", "--cap-add", "CAP_CHOWN"]
    return args + ["--"]


def own_proc() -> bool:
    """Whether ``/proc`` shows this process's own PID namespace. Not so in a process that entered
    a new PID namespace without mounting its ``/proc`` (the reward scorer processes): bubblewrap
    looks its child up there by PID and fails or hangs."""
    try:
        return os.readlink("/proc/self") == str(os.getpid())
    except OSError:
        return False


def detect_isolation() -> Isolation:
    """The strongest level that works here: bubblewrap is tried with a real command (once per
    process; the ``/proc`` check runs every time, as a forked child may be in another namespace)."""
    if not own_proc():
        return Isolation(
            RLIMITS,
            "this process is in a PID namespace without its own /proc (e.g. a reward "
            "scorer process), where bubblewrap cannot run; send the code to `hybridflow sandbox`",
        )
    return _probe_bwrap()


@lru_cache(maxsize=1)
def _probe_bwrap() -> Isolation:
    path = shutil.which(BWRAP)
    if path is None:
        return Isolation(RLIMITS, "bubblewrap is not installed (Debian/Ubuntu: apt-get install bubblewrap)")
    python, _ = python_paths()
    probe = [*bwrap_arguments(1 << 20, as_root=can_switch_uid()), python, "-I", "-S", "-c", "print('ok')"]
    try:
        out = subprocess.run(probe, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return Isolation(RLIMITS, f"bubblewrap is installed but did not start: {exc}")
    if out.returncode != 0 or out.stdout.strip() != "ok":
        reason = (out.stderr.strip().splitlines() or ["no output"])[-1]
        return Isolation(RLIMITS, f"bubblewrap is installed but cannot create namespaces here: {reason}")
    return Isolation(BWRAP, f"bubblewrap at {path}: namespaces, read-only system, private tmpfs workdir, no network")


def require_isolation(allow_weak: bool, what: str) -> Isolation:
    """The detected isolation, or :class:`IsolationError` when it is weak and ``allow_weak`` is off.

    Weak isolation that was allowed is logged as a warning on every call, not once per process:
    each sandbox built for a run (a tool, a code reward, ``hybridflow sandbox``, the trainer's
    start-up check) says in that run's output that model-written code runs without the strong
    sandbox, so an opt-in made once in a config file cannot go unnoticed later.
    """
    allow_weak = parse_bool(allow_weak, "allow_weak_isolation")  # a truthy "false" must not open the door
    isolation = detect_isolation()
    if isolation.strong:
        return isolation
    if not allow_weak:
        raise IsolationError(
            f"{what} runs untrusted code, and the strongest sandbox here is '{isolation.level}': "
            f"{isolation.detail}. Install bubblewrap, or accept process-level isolation explicitly "
            "(allow_weak_isolation=true / --allow-weak-isolation)."
        )
    logger.warning(
        "%s runs model-written code under WEAK isolation ('%s': %s) because allow_weak_isolation is true: "
        "the code can read what this user can read, open network connections and write where this user "
        "can. Install bubblewrap for the strong sandbox.",
        what,
        isolation.level,
        isolation.detail,
    )
    return isolation
