"""``hybridflow sandbox``: the sandbox as a local HTTP service in Sandbox Fusion's format.

``POST /run_code`` runs one program (:mod:`.fusion` has the format); ``GET /health`` reports
the isolation level and the limits. At most ``max_concurrent`` programs run at once; the
others wait their turn. Per-request ``run_timeout`` and ``memory_limit_MB`` are honoured up to
the server's own caps.

Every request passes the same guard as ``hybridflow serve``'s
(:class:`~hybridflow.utils.http_guard.RequestGuard`): the Host header must name the address
the service listens on, a request from a foreign web page (``Origin``) is refused, ``/run_code``
takes only ``application/json`` bodies of at most ``max_body_bytes`` and, with a ``token``,
only requests carrying ``Authorization: Bearer TOKEN``. Without them any web page open in a
browser on this machine could run code here with a cross-site form POST.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from dataclasses import replace
from typing import Any

from fastapi import (  # the serve extra; this module is imported only to serve
    FastAPI,
    Request,
)
from fastapi.responses import JSONResponse

from hybridflow.sandbox.access import TOKEN_ENV
from hybridflow.sandbox.executor import run_code
from hybridflow.sandbox.fusion import FusionRequest, FusionRequestError, fusion_response
from hybridflow.sandbox.isolation import Isolation
from hybridflow.sandbox.limits import SandboxLimits
from hybridflow.utils.http_guard import (
    BodyTooLarge,
    RequestGuard,
    RouteToken,
    default_allowed_hosts,
    refusal_body,
)

RUN_CODE_PATH = "/run_code"
DEFAULT_MAX_BODY_BYTES = 16 * 1024 * 1024
TOKEN_HINT = f"the token hybridflow sandbox printed at start, or its --token / ${TOKEN_ENV}"


def _refused(status: int, message: str) -> JSONResponse:
    return JSONResponse({"status": "SandboxError", "message": message, "run_result": None}, status_code=status)


def create_app(
    limits: SandboxLimits,
    isolation: Isolation,
    max_concurrent: int = 4,
    *,
    token: str | None = None,
    allowed_hosts: Iterable[str] | None = None,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
) -> FastAPI:
    """The FastAPI app behind its request guard; ``limits`` are the caps (and defaults) of every
    request. ``token``: the bearer token ``/run_code`` needs (None: none); ``allowed_hosts``:
    the Host names answered (default: the loopback names); ``max_body_bytes``: the body limit."""
    if max_concurrent < 1:
        raise ValueError(f"max_concurrent must be >= 1, got {max_concurrent}")
    app = FastAPI(title="hybridflow sandbox")
    slots = asyncio.Semaphore(max_concurrent)
    hosts = frozenset(allowed_hosts) if allowed_hosts is not None else default_allowed_hosts("127.0.0.1")
    route_token = RouteToken(token, frozenset({RUN_CODE_PATH}), TOKEN_HINT) if token else None
    app.add_middleware(
        RequestGuard, allowed_hosts=hosts, api_key=None, max_body_bytes=max_body_bytes, route_token=route_token
    )

    @app.exception_handler(BodyTooLarge)
    async def _too_large(request: Request, err: BodyTooLarge) -> JSONResponse:
        return JSONResponse(refusal_body(str(err), "body_too_large"), status_code=413)  # as the guard's own 413

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {
            "isolation": isolation.level,
            "detail": isolation.detail,
            "max_concurrent": max_concurrent,
            "limits": {
                "wall_s": limits.wall_s,
                "memory_mb": limits.memory_mb,
                "max_processes": limits.max_processes,
                "max_output_bytes": limits.max_output_bytes,
            },
        }

    @app.post(RUN_CODE_PATH)
    async def run(request: Request) -> JSONResponse:
        return await _run_code(request, limits, isolation, slots)

    return app


async def _run_code(
    request: Request, limits: SandboxLimits, isolation: Isolation, slots: asyncio.Semaphore
) -> JSONResponse:
    """``POST /run_code``: one program, its limits the request's own capped by the server's."""
    try:
        job = FusionRequest.from_json(await request.json())
    except FusionRequestError as exc:
        return _refused(400, str(exc))
    except RecursionError:  # json's reader gives up on a body nested ~1,000 levels deep
        return _refused(400, "the body nests objects or lists too deeply to be read")
    except ValueError:
        return _refused(400, "the body is not JSON")
    run_limits = replace(
        limits,
        wall_s=min(job.run_timeout or limits.wall_s, limits.wall_s),
        memory_mb=min(job.memory_limit_mb or limits.memory_mb, limits.memory_mb),
    )
    async with slots:
        result = await run_code(job.code, stdin=job.stdin, files=job.files, limits=run_limits, isolation=isolation)
    return JSONResponse(fusion_response(result))
