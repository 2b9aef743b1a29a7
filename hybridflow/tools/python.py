"""A Python tool: the model's code runs in a separate interpreter with a timeout and a memory cap.

Each call starts a fresh ``python -I -u`` (isolated mode: no user site, no ``PYTHON*``
variables; unbuffered, so prints and tracebacks arrive in order) in its own session and an
empty temporary working directory, with a minimal environment. A small launcher caps the
address space (``RLIMIT_AS``) and CPU time, then runs the code read from stdin. A call that
passes ``timeout_s`` has its whole process group killed; output beyond ``max_output_bytes``
is cut and the process stopped. The model reads stdout and stderr together, and the exit
status when it is not 0.

This is process isolation, not a security sandbox: the code runs as the same user and can
read the same files. The sandbox service (a later issue) hardens it.
"""

from __future__ import annotations

import asyncio
import math
import os
import signal
import sys
import tempfile
from typing import Any

from hybridflow.tools.base import BaseTool, ToolOutput

DEFAULT_TIMEOUT_S = 10.0
DEFAULT_MEMORY_LIMIT_MB = 512
DEFAULT_MAX_OUTPUT_BYTES = 64 * 1024

# Runs first in the child: caps, then the user's code from stdin as __main__.
_LAUNCHER = """\
import resource, sys
memory_mb, cpu_s = int(sys.argv[1]), int(sys.argv[2])
if memory_mb > 0:
    resource.setrlimit(resource.RLIMIT_AS, (memory_mb * 2**20, memory_mb * 2**20))
resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s + 1))
source = sys.stdin.read()
sys.stdin.close()
sys.argv = ["<tool>"]
try:
    exec(compile(source, "<tool>", "exec"), {"__name__": "__main__", "__builtins__": __builtins__})
except SystemExit:
    raise
except BaseException as exc:  # the traceback starts at the user's code, not at this launcher
    import traceback
    traceback.print_exception(type(exc), exc, exc.__traceback__.tb_next)
    sys.exit(1)
"""


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


async def run_python(
    code: str,
    *,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    memory_limit_mb: int = DEFAULT_MEMORY_LIMIT_MB,
    max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES,
) -> tuple[str, int | None]:
    """(combined stdout+stderr, exit code) of ``code`` run in a fresh interpreter.

    The exit code is None when the run was stopped (timeout or too much output); the text
    then ends with a line saying why.
    """
    with tempfile.TemporaryDirectory(prefix="hybridflow-python-tool-") as workdir:
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": workdir, "LANG": "C.UTF-8"}
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-I", "-u", "-c", _LAUNCHER, str(int(memory_limit_mb)), str(math.ceil(timeout_s) + 1),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            cwd=workdir,
            env=env,
            start_new_session=True,
        )
        assert proc.stdin is not None and proc.stdout is not None
        output = bytearray()
        stopped: str | None = None

        async def feed_and_read() -> None:
            nonlocal stopped
            proc.stdin.write(code.encode("utf-8"))
            try:
                await proc.stdin.drain()
            except (BrokenPipeError, ConnectionResetError):
                pass
            proc.stdin.close()
            while True:
                chunk = await proc.stdout.read(65536)
                if not chunk:
                    return
                output.extend(chunk)
                if len(output) > max_output_bytes:
                    stopped = f"[stopped: more than {max_output_bytes} bytes of output]"
                    return

        try:
            await asyncio.wait_for(feed_and_read(), timeout_s)
        except TimeoutError:
            stopped = f"[stopped: did not finish within {timeout_s:g} s]"
        if stopped is not None:
            _kill_group(proc.pid)
        returncode = await proc.wait()
        _kill_group(proc.pid)  # anything the code started in its session
    text = bytes(output[:max_output_bytes]).decode("utf-8", errors="replace")
    if stopped is not None:
        return (text + ("\n" if text and not text.endswith("\n") else "") + stopped), None
    return text, returncode


class PythonTool(BaseTool):
    """``python(code)``: run a Python program and read what it prints.

    Config keys (tool YAML ``config:``): ``timeout_s`` (default 10), ``memory_limit_mb``
    (default 512; 0 = no cap), ``max_output_bytes`` (default 65536).
    """

    def default_schema(self) -> dict[str, Any]:
        return {
            "type": "function",
            "function": {
                "name": "python",
                "description": "Run a Python 3 program and return what it prints (stdout and stderr).",
                "parameters": {
                    "type": "object",
                    "properties": {
                        "code": {"type": "string", "description": "the program; use print() to show results"}
                    },
                    "required": ["code"],
                },
            },
        }

    async def execute(self, instance_id: str, parameters: dict[str, Any]) -> ToolOutput:
        code = parameters.get("code")
        if not isinstance(code, str):
            raise ValueError("missing required argument: code (a string)")
        text, returncode = await run_python(
            code,
            timeout_s=float(self.config.get("timeout_s", DEFAULT_TIMEOUT_S)),
            memory_limit_mb=int(self.config.get("memory_limit_mb", DEFAULT_MEMORY_LIMIT_MB)),
            max_output_bytes=int(self.config.get("max_output_bytes", DEFAULT_MAX_OUTPUT_BYTES)),
        )
        if returncode not in (0, None):
            separator = "" if not text or text.endswith("\n") else "\n"
            text = f"{text}{separator}[exit code {returncode}]"
        return text, 0.0, {"exit_code": returncode}
