"""A ``hybridflow sandbox`` child process for the trainer's code rewards.

Reward scorers run in processes of their own inside a user namespace (``workers/reward``),
where root cannot give each program a uid of its own, so the process cap would not hold there.
The trainer therefore starts the sandbox service once, as itself, on a free loopback port, and
the scorers send their programs to it (:class:`~hybridflow.sandbox.client.FusionSandbox`). The
service is stopped when :meth:`LocalSandboxService.close` runs or the trainer exits.
"""

from __future__ import annotations

import atexit
import json
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

from hybridflow.sandbox.limits import SandboxLimits


class LocalSandboxService:
    """Start ``python -m hybridflow.sandbox`` on 127.0.0.1 and wait until it answers ``/health``."""

    def __init__(self, limits: SandboxLimits, *, max_concurrent: int = 4, allow_weak_isolation: bool = False,
                 start_timeout_s: float = 60.0) -> None:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        command = [
            sys.executable, "-m", "hybridflow.sandbox", "--host", "127.0.0.1", "--port", str(port),
            "--max-concurrent", str(max_concurrent), "--timeout-s", str(limits.wall_s),
            "--memory-limit-mb", str(limits.memory_mb), "--max-processes", str(limits.max_processes),
            "--max-output-bytes", str(limits.max_output_bytes),
        ] + (["--allow-weak-isolation"] if allow_weak_isolation else [])
        self._log = tempfile.TemporaryFile(mode="w+")
        self._proc = subprocess.Popen(command, stdout=self._log, stderr=subprocess.STDOUT, text=True)
        atexit.register(self.close)
        deadline = time.monotonic() + start_timeout_s
        while True:
            if self._proc.poll() is not None:
                self._log.seek(0)
                output = self._log.read()
                raise RuntimeError(f"the local sandbox service exited with {self._proc.returncode}: {output.strip()}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as response:
                    self.health = json.loads(response.read())
                break
            except OSError:
                if time.monotonic() > deadline:
                    self.close()
                    raise RuntimeError(f"the local sandbox service did not answer on {self.url} within {start_timeout_s:g} s")
                time.sleep(0.1)

    def close(self) -> None:
        if self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
