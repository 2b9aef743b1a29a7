"""``hybridflow serve`` as a child process on a free loopback port — how the trainer serves a
judge model to a custom reward function (``reward_router_address``)."""

from __future__ import annotations

import sys

from hybridflow.utils.child_service import ChildService


class LocalServer(ChildService):
    """``python -m hybridflow.entrypoints.serve --model MODEL`` on 127.0.0.1, ready when ``/health`` answers."""

    def __init__(
        self, model: str, *, dtype: str = "auto", trust_remote_code: bool = False, start_timeout_s: float = 300.0
    ) -> None:
        def command(port: int) -> list[str]:
            return [
                sys.executable,
                "-m",
                "hybridflow.entrypoints.serve",
                "--model",
                model,
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--dtype",
                dtype,
            ] + (["--trust-remote-code"] if trust_remote_code else [])

        super().__init__(command, f"the judge server ({model})", start_timeout_s=start_timeout_s)
