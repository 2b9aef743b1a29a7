"""A ``hybridflow sandbox`` child process for the trainer's code rewards.

Reward scorers run in processes of their own inside a user namespace (``hybridflow/reward``),
where root cannot give each program a uid of its own, so the process cap would not hold there.
The trainer therefore starts the sandbox service once, as itself, on a free loopback port, and
the scorers send their programs to it (:class:`~hybridflow.sandbox.client.FusionSandbox`). The
service is stopped when :meth:`LocalSandboxService.close` runs or the trainer exits.

The service needs a token for ``/run_code`` like any ``hybridflow sandbox``: a fresh one is
made here, handed to the child in its environment (not on its command line, which every user
of the machine can read) and kept in :attr:`LocalSandboxService.token` for the scorers' client.
"""

from __future__ import annotations

import sys

from hybridflow.sandbox.access import TOKEN_ENV
from hybridflow.sandbox.limits import SandboxLimits
from hybridflow.utils.child_service import ChildService
from hybridflow.utils.http_guard import new_token


class LocalSandboxService(ChildService):
    """Start ``python -m hybridflow.entrypoints.sandbox`` on 127.0.0.1 and wait until it answers ``/health``;
    ``token`` is what its ``/run_code`` needs."""

    def __init__(
        self,
        limits: SandboxLimits,
        *,
        max_concurrent: int = 4,
        allow_weak_isolation: bool = False,
        start_timeout_s: float = 60.0,
    ) -> None:
        def command(port: int) -> list[str]:
            return [
                sys.executable,
                "-m",
                "hybridflow.entrypoints.sandbox",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--max-concurrent",
                str(max_concurrent),
                "--timeout-s",
                str(limits.wall_s),
                "--memory-limit-mb",
                str(limits.memory_mb),
                "--max-processes",
                str(limits.max_processes),
                "--max-output-bytes",
                str(limits.max_output_bytes),
            ] + (["--allow-weak-isolation"] if allow_weak_isolation else [])

        self.token = new_token()
        super().__init__(
            command, "the local sandbox service", start_timeout_s=start_timeout_s, env={TOKEN_ENV: self.token}
        )
