"""The real server process on 127.0.0.1 (a free port, the tiny model), and a small HTTP helper.

The server runs with an API key and a weights root, so the tests cover both; the helper sends
the key unless told otherwise.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
STARTUP_TIMEOUT_S = 120.0
API_KEY = "test-key-1234"


@dataclass
class Server:
    base_url: str  # http://127.0.0.1:PORT
    process: subprocess.Popen
    log: Path
    weights_root: Path  # the server's --weights-root
    api_key: str = API_KEY

    def request(self, method: str, path: str, body: dict | None = None, timeout: float = 60.0,
                headers: dict[str, str] | None = None) -> tuple[int, dict]:
        """(status, JSON body) of one call; HTTP errors are returned, not raised. ``headers``
        replace the default ones (JSON content type and the API key)."""
        data = None if body is None else json.dumps(body).encode()
        if headers is None:
            headers = {"Content-Type": "application/json", "Authorization": f"Bearer {self.api_key}"}
        req = urllib.request.Request(self.base_url + path, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                return resp.status, json.loads(resp.read())
        except urllib.error.HTTPError as err:
            return err.code, json.loads(err.read())


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _wait_ready(server: Server) -> None:
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise RuntimeError(f"server exited with {server.process.returncode}:\n{server.log.read_text()}")
        try:
            if server.request("GET", "/health", timeout=2.0)[0] == 200:
                return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(0.2)
    raise RuntimeError(f"server not ready after {STARTUP_TIMEOUT_S:.0f} s:\n{server.log.read_text()}")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """``hybridflow serve --model tiny-llama`` in a subprocess; terminated after the module."""
    port = _free_port()
    log = tmp_path_factory.mktemp("server") / "server.log"
    weights_root = tmp_path_factory.mktemp("weights_root")
    # One intra-op thread: on a busy shared machine a 2-thread op waits for its descheduled peer.
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "hybridflow.cli", "serve", "--model", "tiny-llama", "--host", "127.0.0.1",
           "--port", str(port), "--max-batch-rows", "32", "--log-level", "warning",
           "--weights-root", str(weights_root),
           "--dtype", "fp32"]  # the tests compare with an fp32 sampler in this process
    env["HYBRIDFLOW_API_KEY"] = API_KEY
    with log.open("w") as fh:
        process = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=fh, stderr=subprocess.STDOUT)
    srv = Server(f"http://127.0.0.1:{port}", process, log, weights_root)
    try:
        _wait_ready(srv)
        yield srv
    finally:
        process.terminate()
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=5)
