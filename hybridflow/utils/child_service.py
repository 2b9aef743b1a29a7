"""An HTTP service run as a child process on a free loopback port (the trainer's helpers:
the code sandbox, a judge model's server). Started, waited for until its health route
answers, and stopped on :meth:`ChildService.close` or when the parent exits."""

from __future__ import annotations

import atexit
import json
import os
import socket
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Callable, Mapping
from typing import Any


def free_loopback_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class ChildService:
    """``command(port)`` started on 127.0.0.1; ``url``/``address`` once ``health_path`` answers
    200 (its JSON body in ``health``). ``what`` names the service in errors, which include its output.
    ``env`` is added to this process's environment for the child (a secret there stays out of
    the process list, where command-line arguments are visible to every user)."""

    def __init__(
        self,
        command: Callable[[int], list[str]],
        what: str,
        *,
        health_path: str = "/health",
        start_timeout_s: float = 60.0,
        env: Mapping[str, str] | None = None,
    ) -> None:
        port = free_loopback_port()
        self.what = what
        self.address = f"127.0.0.1:{port}"
        self.url = f"http://{self.address}"
        self._log = tempfile.TemporaryFile(mode="w+")
        child_env = {**os.environ, **env} if env else None
        self._proc = subprocess.Popen(
            command(port), stdout=self._log, stderr=subprocess.STDOUT, text=True, env=child_env
        )
        atexit.register(self.close)
        deadline = time.monotonic() + start_timeout_s
        while True:
            if self._proc.poll() is not None:
                raise RuntimeError(f"{what} exited with {self._proc.returncode}: {self.output().strip()}")
            try:
                with urllib.request.urlopen(self.url + health_path, timeout=2) as response:
                    self.health: Any = json.loads(response.read() or b"null")
                break
            except OSError as err:
                if time.monotonic() > deadline:
                    self.close()
                    raise RuntimeError(
                        f"{what} did not answer on {self.url} within {start_timeout_s:g} s: "
                        f"{self.output().strip()[-2000:]}"
                    ) from err
                time.sleep(0.1)

    def output(self) -> str:
        """What the child printed so far."""
        self._log.seek(0)
        return self._log.read()

    def close(self) -> None:
        if self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
