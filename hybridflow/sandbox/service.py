"""``hybridflow sandbox``: the sandbox as a local HTTP service in Sandbox Fusion's format.

``POST /run_code`` runs one program (:mod:`.fusion` has the format); ``GET /health`` reports
the isolation level and the limits. At most ``max_concurrent`` programs run at once; the
others wait their turn. Per-request ``run_timeout`` and ``memory_limit_MB`` are honoured up to
the server's own caps.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any

from fastapi import FastAPI, Request  # the serve extra; this module is imported only to serve
from fastapi.responses import JSONResponse

from hybridflow.sandbox.executor import run_code
from hybridflow.sandbox.fusion import FusionRequest, FusionRequestError, fusion_response
from hybridflow.sandbox.isolation import Isolation
from hybridflow.sandbox.limits import SandboxLimits


def create_app(limits: SandboxLimits, isolation: Isolation, max_concurrent: int = 4) -> FastAPI:
    """The FastAPI app; ``limits`` are the caps (and defaults) of every request."""
    if max_concurrent < 1:
        raise ValueError(f"max_concurrent must be >= 1, got {max_concurrent}")
    app = FastAPI(title="hybridflow sandbox")
    slots = asyncio.Semaphore(max_concurrent)

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"isolation": isolation.level, "detail": isolation.detail, "max_concurrent": max_concurrent,
                "limits": {"wall_s": limits.wall_s, "memory_mb": limits.memory_mb,
                           "max_processes": limits.max_processes, "max_output_bytes": limits.max_output_bytes}}

    @app.post("/run_code")
    async def run(request: Request) -> JSONResponse:
        try:
            job = FusionRequest.from_json(await request.json())
        except FusionRequestError as exc:
            return JSONResponse({"status": "SandboxError", "message": str(exc), "run_result": None}, status_code=400)
        except ValueError:
            return JSONResponse({"status": "SandboxError", "message": "the body is not JSON", "run_result": None},
                                status_code=400)
        run_limits = replace(
            limits,
            wall_s=min(job.run_timeout or limits.wall_s, limits.wall_s),
            memory_mb=min(job.memory_limit_mb or limits.memory_mb, limits.memory_mb),
        )
        async with slots:
            result = await run_code(job.code, stdin=job.stdin, files=job.files, limits=run_limits, isolation=isolation)
        return JSONResponse(fusion_response(result))

    return app
