"""A ``hybridflow sandbox`` child process for the trainer's code rewards.

Reward scorers run in processes of their own inside a user namespace (``workers/reward``),
where root cannot give each program a uid of its own, so the process cap would not hold there.
The trainer therefore starts the sandbox service once, as itself, on a free loopback port, and
the scorers send their programs to it (:class:`~hybridflow.sandbox.client.FusionSandbox`). The
service is stopped when :meth:`LocalSandboxService.close` runs or the trainer exits.
"""

from __future__ import annotations

import sys

from hybridflow.sandbox.limits import SandboxLimits
from hybridflow.utils.child_service import ChildService


class LocalSandboxService(ChildService):
    """Start ``python -m hybridflow.sandbox`` on 127.0.0.1 and wait until it answers ``/health``."""

    def __init__(self, limits: SandboxLimits, *, max_concurrent: int = 4, allow_weak_isolation: bool = False,
                 start_timeout_s: float = 60.0) -> None:
        def command(port: int) -> list[str]:
            return [
                sys.executable, "-m", "hybridflow.sandbox", "--host", "127.0.0.1", "--port", str(port),
                "--max-concurrent", str(max_concurrent), "--timeout-s", str(limits.wall_s),
                "--memory-limit-mb", str(limits.memory_mb), "--max-processes", str(limits.max_processes),
                "--max-output-bytes", str(limits.max_output_bytes),
            ] + (["--allow-weak-isolation"] if allow_weak_isolation else [])

        super().__init__(command, "the local sandbox service", start_timeout_s=start_timeout_s)
