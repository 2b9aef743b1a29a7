"""A Python tool: the model's code runs in the sandbox (:mod:`hybridflow.sandbox`).

Each call is one sandboxed run — a fresh interpreter in a private empty working directory,
with the wall-clock, CPU, memory, process and output limits of
:class:`~hybridflow.sandbox.limits.SandboxLimits` — under the strongest isolation the machine
has (bubblewrap; see docs/sandbox.md). Where only process-level isolation exists, the tool
refuses to start unless its config says ``allow_weak_isolation: true`` — a real boolean: a
quoted ``"false"``, ``"no"`` or a ``0`` is a start-up error naming the key, never read as
true — and then warns each time it is built. The model reads stdout, then stderr, then the
exit status when it is not 0, or why the run was stopped.
"""

from __future__ import annotations

from typing import Any

from hybridflow.sandbox.client import LocalSandbox
from hybridflow.sandbox.executor import FINISHED, RunResult
from hybridflow.sandbox.limits import SandboxLimits
from hybridflow.tools.base import BaseTool, ToolOutput, one_string_param_schema
from hybridflow.utils.booleans import parse_bool

DEFAULT_TIMEOUT_S = 10.0
DEFAULT_MEMORY_LIMIT_MB = 512
DEFAULT_MAX_OUTPUT_BYTES = 64 * 1024
DEFAULT_MAX_PROCESSES = 16


def tool_text(result: RunResult) -> str:
    """What the model reads of one run."""
    text = result.stdout + result.stderr
    if result.status == FINISHED and result.return_code not in (0, None):
        separator = "" if not text or text.endswith("\n") else "\n"
        text = f"{text}{separator}[exit code {result.return_code}]"
    # a stop note follows stderr on a new line; with nothing printed before it, that line is empty
    return text.lstrip("\n") if not result.stdout else text


class PythonTool(BaseTool):
    """``python(code)``: run a Python program and read what it prints.

    Config keys (tool YAML ``config:``): ``timeout_s`` (default 10), ``memory_limit_mb``
    (default 512), ``max_output_bytes`` (default 65536, stdout and stderr each),
    ``max_processes`` (default 16), ``max_concurrent`` (default 4), ``allow_weak_isolation``
    (default false).
    """

    KEYS = (
        "type",
        "timeout_s",
        "memory_limit_mb",
        "max_output_bytes",
        "max_processes",
        "max_concurrent",
        "allow_weak_isolation",
    )

    def __init__(self, config: dict[str, Any] | None = None, tool_schema: dict[str, Any] | None = None) -> None:
        super().__init__(config, tool_schema)
        unknown = sorted(set(self.config) - set(self.KEYS))
        if unknown:
            raise ValueError(f"unknown config key(s) {unknown} of the python tool; valid: {', '.join(self.KEYS)}")
        limits = SandboxLimits(
            wall_s=float(self.config.get("timeout_s", DEFAULT_TIMEOUT_S)),
            memory_mb=int(self.config.get("memory_limit_mb", DEFAULT_MEMORY_LIMIT_MB)),
            max_output_bytes=int(self.config.get("max_output_bytes", DEFAULT_MAX_OUTPUT_BYTES)),
            max_processes=int(self.config.get("max_processes", DEFAULT_MAX_PROCESSES)),
        )
        self.sandbox = LocalSandbox(
            limits,
            max_concurrent=int(self.config.get("max_concurrent", 4)),
            allow_weak_isolation=parse_bool(self.config.get("allow_weak_isolation", False), "allow_weak_isolation"),
            what="the python tool",
        )

    def default_schema(self) -> dict[str, Any]:
        return one_string_param_schema(
            "python",
            "Run a Python 3 program and return what it prints (stdout and stderr).",
            "code",
            "the program; use print() to show results",
        )

    async def execute(self, instance_id: str, parameters: dict[str, Any]) -> ToolOutput:
        code = parameters.get("code")
        if not isinstance(code, str):
            raise ValueError("missing required argument: code (a string)")
        result = await self.sandbox.run(code)
        return tool_text(result), 0.0, {"exit_code": result.return_code, "status": result.status}
