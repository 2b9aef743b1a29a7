"""``code_interpreter(code)`` on a Sandbox Fusion server, configured with verl's keys.

The built-in that verl's ``verl.tools.sandbox_fusion_tools.SandboxFusionTool`` class path maps
to when verl is not installed (:mod:`hybridflow.tools.verl_adapter`). Each call posts the code
to ``sandbox_fusion_url`` (:class:`~hybridflow.sandbox.client.FusionSandbox`: a real Sandbox
Fusion server or ``hybridflow sandbox``). As in verl's tool, the model reads stdout followed by
stderr when the run finished and ``no stdout here`` otherwise, a call may set its own
``timeout`` (seconds), and the tool gives no step reward.

Config keys (verl's): ``sandbox_fusion_url`` (required), ``default_timeout`` (30 s),
``memory_limit_mb`` (1024), ``default_language`` (only ``python`` runs here), ``num_workers``
(10), ``rate_limit`` (10) and ``enable_global_rate_limit`` (true). At most ``num_workers``
requests — ``min(num_workers, rate_limit)`` with the rate limit on — are in flight per
process; verl's limit is shared by all processes of a run, this one is per process.
"""

from __future__ import annotations

from typing import Any

from hybridflow.sandbox.client import FusionSandbox
from hybridflow.sandbox.executor import FINISHED
from hybridflow.tools.base import BaseTool, ToolOutput, one_string_param_schema
from hybridflow.utils.booleans import parse_bool

KEYS = (
    "type",
    "sandbox_fusion_url",
    "default_timeout",
    "memory_limit_mb",
    "default_language",
    "num_workers",
    "rate_limit",
    "enable_global_rate_limit",
)
NOT_FINISHED_TEXT = "no stdout here"


class SandboxFusionTool(BaseTool):
    """See the module docstring."""

    def __init__(self, config: dict[str, Any] | None = None, tool_schema: dict[str, Any] | None = None) -> None:
        super().__init__(config, tool_schema)
        unknown = sorted(set(self.config) - set(KEYS))
        if unknown:
            raise ValueError(f"unknown config key(s) {unknown} of the sandbox fusion tool; valid: {', '.join(KEYS)}")
        url = self.config.get("sandbox_fusion_url") or ""
        if not url:
            raise ValueError("the sandbox fusion tool needs config.sandbox_fusion_url (the server's /run_code URL)")
        language = self.config.get("default_language", "python")
        if language != "python":
            raise ValueError(f"default_language {language!r} is not supported; only 'python' runs here")
        workers = int(self.config.get("num_workers", 10))
        if parse_bool(self.config.get("enable_global_rate_limit", True), "enable_global_rate_limit"):
            workers = min(workers, int(self.config.get("rate_limit", 10)))
        self.default_timeout = float(self.config.get("default_timeout", 30))
        self.sandbox = FusionSandbox(
            url,
            max_concurrent=workers,
            memory_mb=int(self.config.get("memory_limit_mb", 1024)),
            timeout_s=self.default_timeout,
        )

    def default_schema(self) -> dict[str, Any]:
        return one_string_param_schema("code_interpreter", "A tool for executing code.", "code", "The code to execute.")

    async def execute(self, instance_id: str, parameters: dict[str, Any]) -> ToolOutput:
        language = parameters.get("language", "python")
        if language != "python":
            raise ValueError(f"language {language!r} is not supported; only python runs here")
        code = parameters.get("code", "")
        timeout = float(parameters.get("timeout", self.default_timeout))
        result = await self.sandbox.run(code if isinstance(code, str) else str(code), timeout_s=timeout)
        text = result.stdout + result.stderr if result.status == FINISHED else NOT_FINISHED_TEXT
        return text, None, {}
