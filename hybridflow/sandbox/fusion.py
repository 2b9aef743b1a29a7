"""Sandbox Fusion's ``/run_code`` format: the request fields, and a :class:`RunResult` as its response.

Request (JSON)::

    {"code": "print(1)", "language": "python", "stdin": "", "run_timeout": 10,
     "compile_timeout": 10, "memory_limit_MB": 1024, "files": {"data.txt": "<base64>"}, "fetch_files": []}

Response::

    {"status": "Success" | "Failed" | "SandboxError", "message": "",
     "compile_result": null,
     "run_result": {"status": "Finished" | "TimeLimitExceeded" | "OutputLimitExceeded",
                    "execution_time": 0.05, "return_code": 0, "stdout": "1\\n", "stderr": ""},
     "executor_pod_name": null, "files": {}}

``Success`` means the program finished with exit status 0; ``Failed`` that it ran but did not
(``run_result`` says how); ``SandboxError`` that it could not be run (``message`` says why).
This is the subset verl's ``sandbox_fusion`` reward and tool read. Only Python runs here;
``compile_timeout`` has nothing to time for it and ``fetch_files`` is refused.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass, field
from typing import Any

from hybridflow.sandbox.executor import FINISHED, SANDBOX_ERROR, RunResult

LANGUAGES: tuple[str, ...] = ("python", "python3")


class FusionRequestError(ValueError):
    """A request this sandbox cannot run; the message names the field."""


@dataclass(frozen=True)
class FusionRequest:
    code: str
    stdin: str = ""
    run_timeout: float | None = None
    memory_limit_mb: int | None = None
    files: dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_json(cls, body: Any) -> FusionRequest:
        if not isinstance(body, dict):
            raise FusionRequestError(f"the request body must be a JSON object, got {type(body).__name__}")
        code = body.get("code")
        if not isinstance(code, str):
            raise FusionRequestError("'code' must be a string")
        language = body.get("language", "python")
        if language not in LANGUAGES:
            raise FusionRequestError(f"language {language!r} is not supported here; supported: {', '.join(LANGUAGES)}")
        stdin = body.get("stdin") or ""
        if not isinstance(stdin, str):
            raise FusionRequestError("'stdin' must be a string")
        timeout = body.get("run_timeout")
        if timeout is not None and (not isinstance(timeout, (int, float)) or isinstance(timeout, bool) or timeout <= 0):
            raise FusionRequestError(f"'run_timeout' must be a positive number, got {timeout!r}")
        memory = body.get("memory_limit_MB")
        if memory is not None and (not isinstance(memory, int) or isinstance(memory, bool) or 0 < memory < 32):
            raise FusionRequestError(
                f"'memory_limit_MB' must be an integer >= 32 (or <= 0: the default), got {memory!r}"
            )
        files = body.get("files") or {}
        if not isinstance(files, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in files.items()):
            raise FusionRequestError("'files' must map file names to base64 strings")
        for name, content in files.items():
            try:
                base64.b64decode(content, validate=True)
            except binascii.Error:
                raise FusionRequestError(f"files[{name!r}] is not valid base64") from None
        if body.get("fetch_files"):
            raise FusionRequestError("'fetch_files' is not supported by this sandbox")
        return cls(
            code,
            stdin,
            None if timeout is None else float(timeout),
            None if memory is None or memory <= 0 else memory,
            files,
        )


def fusion_response(result: RunResult) -> dict[str, Any]:
    """``result`` in Sandbox Fusion's response format (module docstring)."""
    if result.status == SANDBOX_ERROR:
        return {
            "status": "SandboxError",
            "message": result.stderr,
            "compile_result": None,
            "run_result": None,
            "executor_pod_name": None,
            "files": {},
        }
    status = "Success" if result.status == FINISHED and result.return_code == 0 else "Failed"
    run = {
        "status": result.status,
        "execution_time": result.execution_time,
        "return_code": result.return_code,
        "stdout": result.stdout,
        "stderr": result.stderr,
    }
    return {
        "status": status,
        "message": "",
        "compile_result": None,
        "run_result": run,
        "executor_pod_name": None,
        "files": {},
    }


def result_from_fusion(body: dict[str, Any], isolation: str = "remote") -> RunResult:
    """A Sandbox Fusion response (ours or a real server's) as a :class:`RunResult`."""
    if body.get("status") == "SandboxError" or not isinstance(body.get("run_result"), dict):
        compile_result = body.get("compile_result") or {}
        message = (
            body.get("message") or compile_result.get("stderr") or f"status {body.get('status')!r} without run_result"
        )
        return RunResult(SANDBOX_ERROR, None, "", str(message), 0.0, isolation)
    run = body["run_result"]
    return RunResult(
        str(run.get("status")),
        run.get("return_code"),
        run.get("stdout") or "",
        run.get("stderr") or "",
        float(run.get("execution_time") or 0.0),
        isolation,
    )
