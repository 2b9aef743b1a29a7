"""Handing one HTTP call's requests to the engine thread and awaiting them, whole or streamed.

Handlers submit :class:`~hybridflow.inference.batcher_types.GenRequest` s and await their
futures, so many requests are in flight at once and share forward passes. While they wait they
watch the connection: a client that disconnects has its generation cancelled. An engine failure
is worded for the client here (:func:`client_error`): the batcher's refusal is a 400, anything
of ours a 500 that names no internals (the log has them).
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

from fastapi import Request
from fastapi.responses import StreamingResponse

from hybridflow.inference.batcher_types import GenRequest, SampleOutput
from hybridflow.inference.engine_queue import RequestRefused, ShuttingDown
from hybridflow.inference.sampling import NonFiniteLogitsError
from hybridflow.server.checks import BadRequest
from hybridflow.server.errors import ClientDisconnected, GenerationError
from hybridflow.server.state import ServerState
from hybridflow.server.streaming import sse, watch_futures, with_callbacks

logger = logging.getLogger("hybridflow.server")
T = TypeVar("T")
_CALLS = itertools.count()  # one group per HTTP call: the batcher shares rows fairly between them


async def _until_disconnected(request: Request) -> None:
    """Return once the client has closed its connection (the body is already read)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


async def run_requests(
    state: ServerState, request: Request, requests: list[GenRequest], prompt_logprobs: int | None = None
) -> list[list[SampleOutput]]:
    """Submit, await all outputs; cancel everything if the client leaves or one request fails."""
    futures: list[Future] = [state.engine.submit(r, prompt_logprobs) for r in _one_call(requests)]
    gathered = asyncio.gather(*(asyncio.wrap_future(f) for f in futures))
    watcher = asyncio.ensure_future(_until_disconnected(request))
    either: set[asyncio.Future[Any]] = {gathered, watcher}
    try:
        await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
        if not gathered.done():
            raise ClientDisconnected()
        return list(gathered.result())
    except ClientDisconnected:
        raise
    except Exception as err:  # noqa: BLE001 - worded for the client below
        raise client_error(err) from err
    finally:
        watcher.cancel()
        for future in futures:  # the rest of a failed or abandoned call is wasted work
            state.engine.cancel(future)
        if not gathered.done():
            gathered.cancel()


def _one_call(requests: list[GenRequest]) -> list[GenRequest]:
    """The requests of one HTTP call, marked as one group for the batcher's fair admission."""
    call = next(_CALLS)
    return [dataclasses.replace(r, group=call) for r in requests]


def client_error(err: Exception) -> Exception:
    """What the client is told about a request that failed in the engine."""
    if isinstance(err, RequestRefused):  # the batcher refused it (e.g. n above the batch limit)
        return BadRequest(str(err))
    if isinstance(err, NonFiniteLogitsError | ShuttingDown):
        return err
    return GenerationError()  # anything else is ours, not the client's


async def _start_stream(
    state: ServerState, request: Request, requests: list[GenRequest]
) -> tuple[list[Future], asyncio.Queue, tuple]:
    """Submit with token callbacks and wait for the first event (a token, or a request that
    ended), so that a refused or failed request still gets its error status; a client that
    leaves meanwhile cancels everything, as in :func:`run_requests`."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue = asyncio.Queue()
    futures = [state.engine.submit(r) for r in with_callbacks(_one_call(requests), loop, queue)]
    watch_futures(futures, loop, queue)
    first = asyncio.ensure_future(queue.get())
    watcher = asyncio.ensure_future(_until_disconnected(request))
    try:
        await asyncio.wait({first, watcher}, return_when=asyncio.FIRST_COMPLETED)
        if not first.done():
            raise ClientDisconnected()
        item = first.result()
        if item[1] is None and item[2].exception() is not None:
            err = item[2].exception()
            raise client_error(err) from err
        return futures, queue, item
    except BaseException:
        for future in futures:
            state.engine.cancel(future)
        raise
    finally:
        watcher.cancel()
        if not first.done():
            first.cancel()


def stream_error(future: Future) -> str | None:
    """An SSE error event for a request that failed mid-stream, or None."""
    err = future.exception()
    if err is None:
        return None
    logger.error("streamed request failed: %s: %s", type(err).__name__, err, exc_info=err)
    message = str(err) if isinstance(err, NonFiniteLogitsError | ShuttingDown) else "generation failed (internal error)"
    return sse({"error": {"message": message, "type": "server_error", "param": None, "code": None}})


def _streaming_response(state: ServerState, body: Any, futures: list[Future]) -> StreamingResponse:
    """``body`` (an async iterator of SSE events) as the response; generation stops when it ends."""

    async def guarded() -> Any:
        try:
            async for chunk in body:
                yield chunk
        finally:  # done, failed, or the client left (Starlette cancels the stream): stop generating
            for future in futures:
                state.engine.cancel(future)

    return StreamingResponse(
        guarded(), media_type="text/event-stream", headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    )


async def stream_reply(
    state: ServerState, request: Request, requests: list[GenRequest], chunks: Callable[[asyncio.Queue, tuple], Any]
) -> StreamingResponse:
    """Stream one call: submit ``requests`` (:func:`_start_stream`) and answer with the SSE
    events ``chunks(queue, first)`` yields; generation stops when the stream ends."""
    futures, queue, first = await _start_stream(state, request, requests)
    return _streaming_response(state, chunks(queue, first), futures)


async def in_thread(fn: Callable[..., T], *args: Any) -> T:
    """Tokenizing a long prompt takes a while; off the event loop, other connections stay served."""
    return await asyncio.to_thread(fn, *args)
