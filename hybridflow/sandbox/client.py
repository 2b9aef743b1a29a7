"""Where code rewards and tools send programs: the local sandbox or a Sandbox Fusion server.

Both clients have one method, ``await client.run(code, stdin=..., timeout_s=..., memory_mb=...)``
→ :class:`~hybridflow.sandbox.executor.RunResult`, so a scorer does not care where the code
runs:

* :class:`LocalSandbox` — :func:`~hybridflow.sandbox.executor.run_code` in this process's
  machine, at most ``max_concurrent`` at once. It refuses to be built when the isolation is
  weaker than bubblewrap unless ``allow_weak_isolation`` is ``True`` (a real bool), and then
  logs a warning each time one is built.
* :class:`FusionSandbox` — ``POST {url}/run_code`` (``hybridflow sandbox`` or a real Sandbox
  Fusion server; the trainer's ``reward_model.sandbox_fusion.url``, which verl main's
  ``reward.sandbox_fusion.url`` and root ``sandbox_fusion.url`` also set), at most ``max_concurrent``
  requests at once. A server that cannot be reached or answers 5xx is retried ``retries``
  times with a growing pause; then :class:`SandboxUnavailableError` names the URL — a run is
  never silently scored as a failure.
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
import urllib.error
import urllib.request
from dataclasses import replace
from typing import Protocol

from hybridflow.sandbox.access import TOKEN_ENV
from hybridflow.sandbox.executor import RunResult, run_code
from hybridflow.sandbox.fusion import result_from_fusion
from hybridflow.sandbox.isolation import Isolation, require_isolation
from hybridflow.sandbox.limits import SandboxLimits
from hybridflow.utils.errors import InputError


class SandboxUnavailableError(InputError, RuntimeError):
    """The sandbox service cannot be reached or keeps failing; the message names the URL."""


class SandboxClient(Protocol):
    async def run(
        self, code: str, *, stdin: str = "", timeout_s: float | None = None, memory_mb: int | None = None
    ) -> RunResult: ...


class _Slots:
    """An asyncio semaphore per event loop (scorers and agent steps run one loop per call); a
    loop's semaphore goes with the loop."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._by_loop: dict[int, tuple[asyncio.AbstractEventLoop, asyncio.Semaphore]] = {}
        self._lock = threading.Lock()

    def get(self) -> asyncio.Semaphore:
        loop = asyncio.get_running_loop()
        with self._lock:
            for key in [k for k, (other, _) in self._by_loop.items() if other.is_closed()]:
                del self._by_loop[key]  # a semaphore holds its loop: drop both once the loop is closed
            if id(loop) not in self._by_loop:
                self._by_loop[id(loop)] = (loop, asyncio.Semaphore(self.size))
            return self._by_loop[id(loop)][1]


class LocalSandbox:
    """Programs run on this machine under the detected isolation (see the module docstring)."""

    def __init__(
        self,
        limits: SandboxLimits = SandboxLimits(),
        *,
        max_concurrent: int = 4,
        allow_weak_isolation: bool = False,
        what: str = "this code reward",
    ) -> None:
        if max_concurrent < 1:
            raise ValueError(f"max_concurrent must be >= 1, got {max_concurrent}")
        self.isolation: Isolation = require_isolation(allow_weak_isolation, what)
        self.limits = limits
        self._slots = _Slots(max_concurrent)

    async def run(
        self, code: str, *, stdin: str = "", timeout_s: float | None = None, memory_mb: int | None = None
    ) -> RunResult:
        limits = replace(
            self.limits, wall_s=timeout_s or self.limits.wall_s, memory_mb=memory_mb or self.limits.memory_mb
        )
        async with self._slots.get():
            return await run_code(code, stdin=stdin, limits=limits, isolation=self.isolation)


class FusionSandbox:
    """A Sandbox Fusion ``/run_code`` endpoint (see the module docstring)."""

    def __init__(
        self,
        url: str,
        *,
        max_concurrent: int = 4,
        retries: int = 3,
        memory_mb: int = 1024,
        timeout_s: float = 10.0,
        request_timeout_s: float = 30.0,
        token: str | None = None,
    ) -> None:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"sandbox url must start with http:// or https://, got {url!r}")
        self.url = url.rstrip("/")
        self.endpoint = self.url if self.url.endswith("/run_code") else self.url + "/run_code"
        self.retries, self.memory_mb, self.timeout_s = retries, memory_mb, timeout_s
        self.request_timeout_s = request_timeout_s
        # `hybridflow sandbox` needs a bearer token (docs/sandbox.md); a real Sandbox Fusion server ignores it.
        self.token = token or os.environ.get(TOKEN_ENV) or None
        self._slots = _Slots(max_concurrent)

    def _post(self, payload: bytes, timeout_s: float) -> dict:
        headers = {"Content-Type": "application/json"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        request = urllib.request.Request(self.endpoint, data=payload, headers=headers)
        with urllib.request.urlopen(request, timeout=timeout_s + self.request_timeout_s) as response:
            return json.loads(response.read())

    async def run(
        self, code: str, *, stdin: str = "", timeout_s: float | None = None, memory_mb: int | None = None
    ) -> RunResult:
        timeout = timeout_s or self.timeout_s
        payload = json.dumps(
            {
                "code": code,
                "language": "python",
                "stdin": stdin,
                "run_timeout": timeout,
                "compile_timeout": timeout,
                "memory_limit_MB": memory_mb or self.memory_mb,
            }
        ).encode()
        last = ""
        async with self._slots.get():
            for attempt in range(self.retries + 1):
                try:
                    body = await asyncio.to_thread(self._post, payload, timeout)
                    return result_from_fusion(body, isolation=f"remote {self.url}")
                except urllib.error.HTTPError as exc:
                    detail = exc.read().decode("utf-8", errors="replace")[:300]
                    if exc.code < 500:  # the request itself is wrong: retrying will not help
                        raise SandboxUnavailableError(
                            f"sandbox {self.endpoint} refused the request: HTTP {exc.code}: {detail}"
                        ) from None
                    last = f"HTTP {exc.code}: {detail}"
                except (urllib.error.URLError, OSError, TimeoutError, json.JSONDecodeError) as exc:
                    last = f"{type(exc).__name__}: {getattr(exc, 'reason', exc)}"
                if attempt < self.retries:
                    await asyncio.sleep(0.5 * 2**attempt)
        raise SandboxUnavailableError(
            f"sandbox {self.endpoint} is unavailable after {self.retries + 1} attempts ({last}); "
            "start it with `hybridflow sandbox` or fix the URL (reward_model.sandbox_fusion.url, or verl's "
            "reward.sandbox_fusion.url / sandbox_fusion.url)"
        )
