"""The inference-server controls over HTTP: abort/resume, sleep/wake, tensor weight pushes, KV cache.

These routes let a trainer drive a ``hybridflow serve`` process as its rollout engine (see
:class:`~hybridflow.inference.protocol.InferenceServer`; :class:`~hybridflow.inference.client.HttpClient`
is the client). They can stop generation and replace the served weights, so they are off
unless the server was started with ``--control-routes`` (a 403 says so), and they sit behind
the same guard as every route (:mod:`hybridflow.server.security`), which also asks them for
the control token (:data:`CONTROL_PATHS`).

=========================  ============================================================
``POST /abort_all``        every request in flight returns its tokens so far
                           (``finish_reason="abort"``); admission closes → ``{"aborted": n}``
``POST /resume_generation``  admission re-opens; held requests start
``POST /sleep``            ``{"level": 1|2}``: free the KV cache (2: and the weights)
``POST /wake_up``          ``{"tags": ["weights", "kv_cache"] | null}``
``POST /update_weights``   body: one safetensors bucket; query ``update_id``, ``bucket``
                           (0, 1, …), ``final`` (0/1), ``version``. Buckets are checked and
                           staged as they come; the final one swaps all of them in at once,
                           between two steps. Any error drops the staged buckets: the old
                           weights keep serving.
``POST /clear_kv_cache``   drop cached keys/values
``GET /weight_version``    ``{"weight_version": v, "max_weight_bucket_bytes": limit}``
=========================  ============================================================
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI, Request

from hybridflow.inference.protocol import check_sleep_level, check_wake_tags
from hybridflow.inference.weight_transfer import bucket_from_bytes
from hybridflow.inference.weights import WeightsRejected
from hybridflow.server.checks import BadRequest
from hybridflow.server.errors import error_response
from hybridflow.server.schemas import SleepRequest, WakeUpRequest
from hybridflow.server.state import ServerState, WeightUpload

UPDATE_WEIGHTS_PATH = "/update_weights"
UPDATE_FROM_DISK_PATH = "/update_weights_from_disk"
# The routes that need the control token (--control-token, or the one generated at start): they
# stop generation or replace the served weights. /update_weights_from_disk (--weights-root) is
# registered by the app but changes the weights just the same.
CONTROL_PATHS = frozenset(
    {
        "/abort_all",
        "/resume_generation",
        "/sleep",
        "/wake_up",
        UPDATE_WEIGHTS_PATH,
        "/clear_kv_cache",
        UPDATE_FROM_DISK_PATH,
    }
)
CONTROL_TOKEN_HINT = (
    "the control token hybridflow serve printed at start, or its --control-token / "
    "$HYBRIDFLOW_CONTROL_TOKEN / --api-key"
)


def _off() -> Any:
    return error_response(
        403,
        "control routes are off: start the server with --control-routes to let a trainer "
        "abort, sleep, wake and push weights",
        None,
    )


async def _wait(future: Any) -> Any:
    return await asyncio.wrap_future(future)


async def _receive_bucket(state: ServerState, request: Request) -> dict:
    query = request.query_params
    try:
        update_id, bucket = query["update_id"], int(query["bucket"])
        final, version = query.get("final", "0") in ("1", "true"), int(query["version"])
    except (KeyError, ValueError) as err:
        raise BadRequest(
            "update_weights needs query parameters update_id, bucket (int), version (int) and final (0/1)", "update_id"
        ) from err
    upload = state.weight_upload
    if bucket == 0:
        upload = state.weight_upload = WeightUpload(update_id, version)
    elif upload is None or upload.update_id != update_id or upload.next_bucket != bucket:
        expected = (
            "bucket 0 of a new update" if upload is None else f"bucket {upload.next_bucket} of {upload.update_id!r}"
        )
        state.weight_upload = None
        raise BadRequest(
            f"got bucket {bucket} of update {update_id!r}, expected {expected}; the update is dropped "
            "and the served weights are unchanged",
            "bucket",
        )
    body = await request.body()
    try:
        tensors = await asyncio.to_thread(bucket_from_bytes, body)
        staged = await asyncio.to_thread(state.engine.stage, tensors.items())
    except (ValueError, WeightsRejected) as err:
        state.weight_upload = None
        raise BadRequest(f"{err}; the update is dropped and the served weights are unchanged", "body") from err
    upload.staged.update(staged)
    upload.next_bucket += 1
    if not final:
        return {"success": True, "bucket": bucket, "staged_tensors": len(upload.staged)}
    state.weight_upload = None
    try:
        copied = await _wait(state.engine.swap_in(upload.staged, upload.version))
    except WeightsRejected as err:
        raise BadRequest(f"{err}; the served weights are unchanged", "body") from err
    return {"success": True, "num_tensors": copied, "weight_version": state.engine.weight_version}


def _control_decorator(app: FastAPI, state: ServerState) -> Callable[[str], Any]:
    """``@control(path)``: register a POST handler that answers 403 while the control routes are off."""

    def control(path: str) -> Any:
        def register(handler: Any) -> Any:
            @functools.wraps(handler)  # FastAPI reads the handler's signature through the wrapper
            async def guarded(*args: Any, **kwargs: Any) -> Any:
                return await handler(*args, **kwargs) if state.control_routes else _off()

            app.post(path)(guarded)
            return handler

        return register

    return control


async def _sleep_level(change: Callable[[], Any], param: str) -> dict:
    """Await a sleep / wake-up call; a bad level or tag is the client's mistake (400 on ``param``)."""
    try:
        level = await _wait(change())
    except ValueError as err:
        raise BadRequest(str(err), param) from err
    return {"success": True, "sleep_level": level}


def add_control_routes(app: FastAPI, state: ServerState) -> None:
    """Register the routes of the table above on ``app``; each answers 403 while they are off."""
    engine = state.engine
    control = _control_decorator(app, state)

    @control("/abort_all")
    async def abort_all() -> Any:
        return {"aborted": await _wait(engine.abort_all())}

    @control("/resume_generation")
    async def resume_generation() -> Any:
        await _wait(engine.resume_generation())
        return {"success": True}

    @control("/sleep")
    async def sleep(body: SleepRequest) -> Any:
        return await _sleep_level(lambda: engine.sleep(check_sleep_level(body.level)), "level")

    @control("/wake_up")
    async def wake_up(body: WakeUpRequest) -> Any:
        return await _sleep_level(lambda: engine.wake_up(check_wake_tags(body.tags)), "tags")

    @control(UPDATE_WEIGHTS_PATH)
    async def update_weights(request: Request) -> Any:
        return await _receive_bucket(state, request)

    @control("/clear_kv_cache")
    async def clear_kv_cache() -> Any:
        await _wait(engine.clear_kv_cache())
        return {"success": True}

    @app.get("/weight_version")
    async def weight_version() -> dict:
        limit = state.max_weight_bucket_bytes if state.control_routes else None
        return {"weight_version": engine.weight_version, "max_weight_bucket_bytes": limit}
