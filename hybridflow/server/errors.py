"""How the server answers failures: OpenAI-style error bodies, and the exception → status map.

A client mistake is a 4xx whose body names what is wrong:
``{"error": {"message": ..., "type": "invalid_request_error", "param": ..., "code": null}}``.
A failure of ours is a 500 that names no internals; the log line with the same id has them.
"""

from __future__ import annotations

import logging
import traceback
import uuid

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from hybridflow.inference.engine_queue import ShuttingDown
from hybridflow.inference.sampling import NonFiniteLogitsError
from hybridflow.server.checks import BadRequest, OverBudget
from hybridflow.server.security import BodyTooLarge

logger = logging.getLogger("hybridflow.server")
# Innermost frames of a traceback that are logged: a failure deep in a recursion would
# otherwise write thousands of identical lines per request.
MAX_TRACEBACK_FRAMES = 30


class ClientDisconnected(Exception):
    """The client closed the connection before its answer was ready."""


class GenerationError(Exception):
    """A request failed inside the engine for a reason the client cannot fix (logged, not shown)."""


def error_response(
    status: int, message: str, param: str | None = None, kind: str = "invalid_request_error", code: str | None = None
) -> JSONResponse:
    return JSONResponse(
        status_code=status, content={"error": {"message": message, "type": kind, "param": param, "code": code}}
    )


def internal_error(err: BaseException, what: str) -> JSONResponse:
    """A 500 that names no internals; the log line with the same id has the traceback."""
    ref = uuid.uuid4().hex[:12]
    trace = "".join(traceback.format_exception(err, limit=-MAX_TRACEBACK_FRAMES)).rstrip()
    logger.error("%s [error id %s]: %s: %s\n%s", what, ref, type(err).__name__, err, trace)
    return error_response(
        500, f"{what} (internal error, id {ref}; the server log has the details)", kind="server_error"
    )


def validation_message(err: RequestValidationError) -> tuple[str, str | None]:
    """One line naming every invalid field of a request body, and the first field's path."""
    parts, param = [], None
    for item in err.errors():
        loc = ".".join(str(p) for p in item["loc"] if p != "body")
        param = param or loc or None
        message = str(item["msg"]).removeprefix("Value error, ")
        parts.append(f"{loc}: {message}" if loc else message)
    return "; ".join(parts) or "invalid request body", param


def install_error_handlers(app: FastAPI) -> None:
    """Map every exception a route can raise to its status code and body."""

    @app.exception_handler(RequestValidationError)
    async def _on_invalid(request: Request, err: RequestValidationError) -> JSONResponse:
        message, param = validation_message(err)
        return error_response(400, message, param)

    @app.exception_handler(BadRequest)
    async def _on_bad(request: Request, err: BadRequest) -> JSONResponse:
        return error_response(400, str(err), err.param)

    @app.exception_handler(BodyTooLarge)
    async def _on_too_large(request: Request, err: BodyTooLarge) -> JSONResponse:
        return error_response(413, str(err))

    @app.exception_handler(OverBudget)
    async def _on_over_budget(request: Request, err: OverBudget) -> JSONResponse:
        response = error_response(429, str(err), err.param, kind="tokens", code="rate_limit_exceeded")
        response.headers["x-should-retry"] = "false"  # the openai client would resend it in vain
        return response

    @app.exception_handler(HTTPException)
    async def _on_http(request: Request, err: HTTPException) -> JSONResponse:
        # FastAPI's own refusals (a body that is not JSON or nests too deeply for its reader,
        # 404, 405) in the same error body as ours.
        response = error_response(err.status_code, str(err.detail))
        response.headers.update(err.headers or {})
        return response

    @app.exception_handler(ClientDisconnected)
    async def _on_gone(request: Request, err: ClientDisconnected) -> JSONResponse:
        return error_response(499, "the client closed the connection; its generation was cancelled")

    @app.exception_handler(GenerationError)
    async def _on_generation_error(request: Request, err: GenerationError) -> JSONResponse:
        return internal_error(err.__cause__ or err, "generation failed")

    @app.exception_handler(ShuttingDown)
    async def _on_shutdown(request: Request, err: ShuttingDown) -> JSONResponse:
        return error_response(503, str(err), kind="server_error")

    @app.exception_handler(NonFiniteLogitsError)
    async def _on_broken_model(request: Request, err: NonFiniteLogitsError) -> JSONResponse:
        logger.error("%s", err)
        return error_response(500, str(err), kind="server_error")

    @app.exception_handler(Exception)
    async def _on_crash(request: Request, err: Exception) -> JSONResponse:
        return internal_error(err, f"{request.url.path} failed")
