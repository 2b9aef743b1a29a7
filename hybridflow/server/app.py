"""The FastAPI application: the request guard, the error handlers, and every route registered.

The routes live by job — :mod:`~hybridflow.server.completions`, :mod:`~hybridflow.server.chat`,
:mod:`~hybridflow.server.generate_endpoint` (``/generate``), :mod:`~hybridflow.server.control`
(the trainer's controls) — and this module adds the small ones: health, metrics, the model
card and ``/update_weights_from_disk``. Every client mistake is a 400 with an OpenAI-style body
``{"error": {"message": ..., "type": "invalid_request_error", "param": ..., "code": null}}``; a
server-side failure is a 500 whose message names no internals (the log has them); either way
the server keeps serving.
"""

from __future__ import annotations

import asyncio
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from hybridflow.inference.weights import WeightsRejected, folder_under_root
from hybridflow.server.chat import chat_completions
from hybridflow.server.checks import BadRequest, check_text
from hybridflow.server.completions import completions
from hybridflow.server.control import (
    CONTROL_PATHS,
    CONTROL_TOKEN_HINT,
    UPDATE_FROM_DISK_PATH,
    UPDATE_WEIGHTS_PATH,
    add_control_routes,
)
from hybridflow.server.errors import error_response, install_error_handlers
from hybridflow.server.generate_endpoint import generate
from hybridflow.server.schemas import (
    ChatCompletionRequest,
    CompletionRequest,
    GenerateRequest,
    UpdateWeightsRequest,
)
from hybridflow.server.security import RequestGuard, RouteToken
from hybridflow.server.state import ServerState


async def update_weights(state: ServerState, body: UpdateWeightsRequest) -> dict | JSONResponse:
    """Reload weights from a folder inside the weights root, once the running requests are done."""
    if state.weights_root is None:
        return error_response(
            403,
            "weight updates are off: start the server with --weights-root DIR to allow loading "
            "weights from folders inside DIR",
            "model_path",
        )
    check_text(body.model_dump())
    try:
        folder = folder_under_root(state.weights_root, body.model_path)
        copied = await asyncio.wrap_future(state.engine.update_weights_from_disk(folder, body.model_path, body.version))
    except WeightsRejected as err:
        raise BadRequest(str(err), "model_path") from err
    return {
        "success": True,
        "message": f"loaded {copied} tensors from {body.model_path}",
        "num_tensors": copied,
        "weight_version": state.engine.weight_version,
    }


def build_app(state: ServerState) -> FastAPI:
    """The FastAPI app; starts the engine thread on start-up and stops it on shutdown."""

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        state.engine.start()
        yield
        state.engine.shutdown()

    app = FastAPI(title="hybridflow", lifespan=lifespan)
    _add_guard(app, state)
    install_error_handlers(app)
    _add_status_routes(app, state)
    _add_generation_routes(app, state)
    add_control_routes(app, state)
    return app


def _add_guard(app: FastAPI, state: ServerState) -> None:
    """Host, Origin, API key, body sizes and types, and the control token on every request."""
    body_limits = {UPDATE_WEIGHTS_PATH: state.max_weight_bucket_bytes} if state.control_routes else {}
    token = RouteToken(state.control_token, CONTROL_PATHS, CONTROL_TOKEN_HINT) if state.control_token else None
    app.add_middleware(
        RequestGuard,
        allowed_hosts=state.allowed_hosts,
        api_key=state.api_key,
        max_body_bytes=state.limits.max_body_bytes,
        body_limits=body_limits,
        body_types={UPDATE_WEIGHTS_PATH: "application/octet-stream"},
        route_token=token,
    )


def _add_status_routes(app: FastAPI, state: ServerState) -> None:
    """``/health``, ``/metrics`` and ``/v1/models``."""

    @app.get("/health")
    async def health() -> JSONResponse:
        metrics = state.engine.metrics()
        ok = metrics["engine_alive"]
        return JSONResponse(
            status_code=200 if ok else 503,
            content={"status": "ok" if ok else "engine stopped", "model": state.model_name, **metrics},
        )

    @app.get("/metrics")
    async def metrics() -> dict:
        return state.engine.metrics()

    @app.get("/v1/models")
    async def models() -> dict:
        card = {
            "id": state.model_name,
            "object": "model",
            "created": state.created,
            "owned_by": "hybridflow",
            "max_model_len": state.max_model_len,
        }
        return {"object": "list", "data": [card]}


def _add_generation_routes(app: FastAPI, state: ServerState) -> None:
    """The completions, chat, ``/generate`` and ``/update_weights_from_disk`` routes."""

    @app.post("/v1/completions")
    async def _completions(request: Request, body: CompletionRequest) -> Any:
        return await completions(state, request, body)

    @app.post("/v1/chat/completions")
    async def _chat(request: Request, body: ChatCompletionRequest) -> Any:
        return await chat_completions(state, request, body)

    @app.post("/generate")
    async def _generate(request: Request, body: GenerateRequest) -> dict:
        return await generate(state, request, body)

    @app.post(UPDATE_FROM_DISK_PATH)
    async def _update(body: UpdateWeightsRequest) -> Any:
        return await update_weights(state, body)
