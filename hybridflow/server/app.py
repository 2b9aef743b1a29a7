"""The FastAPI application: OpenAI-compatible routes, ``/generate``, weights, health, metrics.

Handlers validate and tokenize, hand :class:`GenRequest` s to the engine thread and await their
futures, so many requests are in flight at once and share forward passes. While they wait they
watch the connection: a client that disconnects has its generation cancelled. Every client
mistake is a 400 with an OpenAI-style body
``{"error": {"message": ..., "type": "invalid_request_error", "param": ..., "code": null}}``; a
server-side failure is a 500 whose message names no internals (the log has them); either way
the server keeps serving.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from hybridflow.inference.continuous import GenRequest, SampleOutput
from hybridflow.inference.engine import GenerationEngine, RequestRefused, ShuttingDown
from hybridflow.inference.sampling import NonFiniteLogitsError, SamplingParams
from hybridflow.inference.weights import WeightsRejected, folder_under_root
from hybridflow.server.checks import BadRequest, ServerLimits, check_text
from hybridflow.server.responses import chat_choice, completion_choice, generate_output, usage
from hybridflow.server.schemas import (
    ChatCompletionRequest,
    CompletionRequest,
    GenerateRequest,
    OpenAISampling,
    UpdateWeightsRequest,
)
from hybridflow.server.security import BodyTooLarge, RequestGuard, default_allowed_hosts
from hybridflow.server.text import TextCodec

logger = logging.getLogger("hybridflow.server")
T = TypeVar("T")


class ClientDisconnected(Exception):
    """The client closed the connection before its answer was ready."""


class GenerationError(Exception):
    """A request failed inside the engine for a reason the client cannot fix (logged, not shown)."""


@dataclass
class ServerState:
    """What the routes need: the engine, the tokenizer, the served model's limits, and the
    server's policy.

    ``eos_token_ids`` end every response unless ``ignore_eos``; ``default_max_tokens`` caps a
    reply when the request gives no limit; ``limits`` caps each request; ``weights_root`` is
    the only folder ``/update_weights_from_disk`` reads from (``None``: the route is off);
    ``allowed_hosts`` / ``api_key`` are checked on every request (see
    :mod:`hybridflow.server.security`).
    """

    engine: GenerationEngine
    codec: TextCodec
    model_name: str
    max_model_len: int
    eos_token_ids: tuple[int, ...]
    default_max_tokens: int = 512
    created: int = 0
    limits: ServerLimits = field(default_factory=ServerLimits)
    weights_root: Path | None = None
    allowed_hosts: frozenset[str] = field(default_factory=lambda: default_allowed_hosts("127.0.0.1"))
    api_key: str | None = None


def _error(status: int, message: str, param: str | None = None, kind: str = "invalid_request_error") -> JSONResponse:
    return JSONResponse(
        status_code=status, content={"error": {"message": message, "type": kind, "param": param, "code": None}}
    )


def _internal_error(err: BaseException, what: str) -> JSONResponse:
    """A 500 that names no internals; the log line with the same id has the traceback."""
    ref = uuid.uuid4().hex[:12]
    logger.error("%s [error id %s]: %s: %s", what, ref, type(err).__name__, err, exc_info=err)
    return _error(500, f"{what} (internal error, id {ref}; the server log has the details)", kind="server_error")


def _validation_message(err: RequestValidationError) -> tuple[str, str | None]:
    parts, param = [], None
    for item in err.errors():
        loc = ".".join(str(p) for p in item["loc"] if p != "body")
        param = param or loc or None
        message = str(item["msg"]).removeprefix("Value error, ")
        parts.append(f"{loc}: {message}" if loc else message)
    return "; ".join(parts) or "invalid request body", param


# ---- request → GenRequests ------------------------------------------------------------------


def _check_model(state: ServerState, name: str) -> None:
    if name != state.model_name:
        raise BadRequest(f"model {name!r} is not served here; available: {state.model_name!r}", "model")


def _check_ids(state: ServerState, prompt: Sequence[int], param: str) -> None:
    if not prompt:
        raise BadRequest("prompt has no tokens", param)
    state.limits.check_prompt_tokens(len(prompt), param)
    bad = [t for t in prompt if not 0 <= t < state.codec.vocab_size]
    if bad:
        raise BadRequest(f"token ids {bad[:5]} are outside the vocabulary [0, {state.codec.vocab_size})", param)


def _budget(state: ServerState, prompt_len: int, limit: int | None, param: str) -> int:
    """max_new_tokens for a prompt: the request's limit, or what is left of the context."""
    room = state.max_model_len - prompt_len
    if room < 1:
        raise BadRequest(f"prompt is {prompt_len} tokens; the model's context is {state.max_model_len}", param)
    if limit is None:
        return min(state.default_max_tokens, room)
    if limit > room:
        raise BadRequest(
            f"prompt ({prompt_len} tokens) + {param}={limit} exceeds the model's context of {state.max_model_len}",
            param,
        )
    return limit


def _sampling(
    state: ServerState, max_new: int, temperature: float, top_k: int, top_p: float, n: int, ignore_eos: bool,
    extra_stops: Sequence[int] = (),
) -> SamplingParams:
    """The sampler's settings for one request; EOS ids always stop (unless ``ignore_eos``)."""
    try:
        return SamplingParams(
            max_new_tokens=max_new,
            temperature=temperature,
            top_k=top_k,
            top_p=top_p,
            do_sample=temperature > 0,
            n=n,
            stop_token_ids=tuple(dict.fromkeys((*state.eos_token_ids, *extra_stops))),
            ignore_eos=ignore_eos,
        )
    except ValueError as err:
        raise BadRequest(str(err)) from err


def _params(state: ServerState, body: OpenAISampling, max_new: int) -> SamplingParams:
    return _sampling(state, max_new, body.temperature, body.top_k, body.top_p, body.n, body.ignore_eos)


def _check_common(state: ServerState, body: OpenAISampling) -> None:
    check_text(body.model_dump(exclude_none=True))
    _check_model(state, body.model)
    state.limits.check_n(body.n)
    state.limits.check_stops(body.stop_strings(), "stop")


async def _until_disconnected(request: Request) -> None:
    """Return once the client has closed its connection (the body is already read)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


async def _run(state: ServerState, request: Request, requests: list[GenRequest]) -> list[list[SampleOutput]]:
    """Submit, await all outputs; cancel everything if the client leaves or one request fails."""
    futures: list[Future] = [state.engine.submit(r) for r in requests]
    gathered = asyncio.gather(*(asyncio.wrap_future(f) for f in futures))
    watcher = asyncio.ensure_future(_until_disconnected(request))
    try:
        await asyncio.wait({gathered, watcher}, return_when=asyncio.FIRST_COMPLETED)
        if not gathered.done():
            raise ClientDisconnected()
        return list(gathered.result())
    except RequestRefused as err:  # the batcher refused it (e.g. n above the batch limit)
        raise BadRequest(str(err)) from err
    except (ClientDisconnected, NonFiniteLogitsError, ShuttingDown):
        raise
    except Exception as err:  # noqa: BLE001 - anything else is ours, not the client's
        raise GenerationError() from err
    finally:
        watcher.cancel()
        for future in futures:  # the rest of a failed or abandoned call is wasted work
            state.engine.cancel(future)
        if not gathered.done():
            gathered.cancel()


async def _in_thread(fn: Callable[..., T], *args: Any) -> T:
    """Tokenizing a long prompt takes a while; off the event loop, other connections stay served."""
    return await asyncio.to_thread(fn, *args)


# ---- routes --------------------------------------------------------------------------------


def _completion_prompts(state: ServerState, body: CompletionRequest) -> list[list[int]]:
    prompt = body.prompt
    if isinstance(prompt, str):
        return [state.codec.encode(prompt)]
    if isinstance(prompt[0], str):
        state.limits.check_prompts(len(prompt), "prompt")
        return [state.codec.encode(p) for p in prompt]  # type: ignore[arg-type]
    if isinstance(prompt[0], int):
        return [list(prompt)]  # type: ignore[arg-type]
    state.limits.check_prompts(len(prompt), "prompt")
    return [list(p) for p in prompt]  # type: ignore[union-attr]


async def completions(state: ServerState, request: Request, body: CompletionRequest) -> dict:
    _check_common(state, body)
    prompts = await _in_thread(_completion_prompts, state, body)
    stops = body.stop_strings()
    requests = []
    for prompt in prompts:
        _check_ids(state, prompt, "prompt")
        params = _params(state, body, _budget(state, len(prompt), body.max_tokens, "max_tokens"))
        top = body.logprobs or 0
        requests.append(GenRequest(tuple(prompt), params, top, state.codec.stop_check(stops), body.seed))
    results = await _run(state, request, requests)
    choices = []
    for outputs in results:
        for out in outputs:
            choices.append(completion_choice(state.codec, out, len(choices), stops, body.logprobs))
    return {
        "id": f"cmpl-{uuid.uuid4().hex}",
        "object": "text_completion",
        "created": int(time.time()),
        "model": state.model_name,
        "choices": choices,
        "usage": usage(prompts, results),
    }


def _chat_prompt(state: ServerState, body: ChatCompletionRequest) -> list[int]:
    try:
        messages = [m.template_dict() for m in body.messages]
    except ValueError as err:
        raise BadRequest(str(err), "messages") from err
    kwargs = dict(body.chat_template_kwargs or {})
    if body.tools:
        kwargs["tools"] = body.tools
    try:
        return state.codec.chat_prompt_ids(messages, kwargs)
    except ValueError as err:  # TextCodec words template failures for the client
        raise BadRequest(f"could not apply the chat template: {err}", "messages") from err


async def chat_completions(state: ServerState, request: Request, body: ChatCompletionRequest) -> dict:
    _check_common(state, body)
    prompt = await _in_thread(_chat_prompt, state, body)
    _check_ids(state, prompt, "messages")
    params = _params(state, body, _budget(state, len(prompt), body.token_limit(), "max_tokens"))
    stops = body.stop_strings()
    top = (body.top_logprobs or 0) if body.logprobs else 0
    (outputs,) = await _run(
        state, request, [GenRequest(tuple(prompt), params, top, state.codec.stop_check(stops), body.seed)]
    )
    choices = [chat_choice(state.codec, out, i, stops, body.logprobs) for i, out in enumerate(outputs)]
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": state.model_name,
        "choices": choices,
        "usage": usage([prompt], [outputs]),
    }


async def generate(state: ServerState, request: Request, body: GenerateRequest) -> dict:
    sp = body.sampling_params
    state.limits.check_n(sp.n, "sampling_params.n")
    state.limits.check_stops(sp.stop_token_ids, "sampling_params.stop_token_ids")
    prompts = body.prompts()
    state.limits.check_prompts(len(prompts), "input_ids")
    requests = []
    for prompt in prompts:
        _check_ids(state, prompt, "input_ids")
        _budget(state, len(prompt), sp.max_new_tokens, "max_new_tokens")
        params = _sampling(state, sp.max_new_tokens, sp.temperature, sp.top_k, sp.top_p, sp.n, sp.ignore_eos,
                           sp.stop_token_ids)
        requests.append(GenRequest(tuple(prompt), params, body.top_logprobs, None, sp.seed))
    results = await _run(state, request, requests)
    outputs = [generate_output(i, out) for i, group in enumerate(results) for out in group]
    return {"model": state.model_name, "outputs": outputs, "usage": usage(prompts, results)}


async def update_weights(state: ServerState, body: UpdateWeightsRequest) -> dict | JSONResponse:
    """Reload weights from a folder inside the weights root, once the running requests are done."""
    if state.weights_root is None:
        return _error(403, "weight updates are off: start the server with --weights-root DIR to allow loading "
                      "weights from folders inside DIR", "model_path")
    check_text(body.model_dump())
    try:
        folder = folder_under_root(state.weights_root, body.model_path)
        copied = await asyncio.wrap_future(state.engine.update_weights_from_disk(folder, body.model_path))
    except WeightsRejected as err:
        raise BadRequest(str(err), "model_path") from err
    return {"success": True, "message": f"loaded {copied} tensors from {body.model_path}",
            "num_tensors": copied, "weight_version": state.engine.weight_version}


def build_app(state: ServerState) -> FastAPI:
    """The FastAPI app; starts the engine thread on start-up and stops it on shutdown."""

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        state.engine.start()
        yield
        state.engine.shutdown()

    app = FastAPI(title="hybridflow", lifespan=lifespan)
    app.add_middleware(RequestGuard, allowed_hosts=state.allowed_hosts, api_key=state.api_key,
                       max_body_bytes=state.limits.max_body_bytes)

    @app.exception_handler(RequestValidationError)
    async def _on_invalid(request: Request, err: RequestValidationError) -> JSONResponse:
        message, param = _validation_message(err)
        return _error(400, message, param)

    @app.exception_handler(BadRequest)
    async def _on_bad(request: Request, err: BadRequest) -> JSONResponse:
        return _error(400, str(err), err.param)

    @app.exception_handler(BodyTooLarge)
    async def _on_too_large(request: Request, err: BodyTooLarge) -> JSONResponse:
        return _error(413, str(err))

    @app.exception_handler(ClientDisconnected)
    async def _on_gone(request: Request, err: ClientDisconnected) -> JSONResponse:
        return _error(499, "the client closed the connection; its generation was cancelled")

    @app.exception_handler(GenerationError)
    async def _on_generation_error(request: Request, err: GenerationError) -> JSONResponse:
        return _internal_error(err.__cause__ or err, "generation failed")

    @app.exception_handler(ShuttingDown)
    async def _on_shutdown(request: Request, err: ShuttingDown) -> JSONResponse:
        return _error(503, str(err), kind="server_error")

    @app.exception_handler(NonFiniteLogitsError)
    async def _on_broken_model(request: Request, err: NonFiniteLogitsError) -> JSONResponse:
        logger.error("%s", err)
        return _error(500, str(err), kind="server_error")

    @app.exception_handler(Exception)
    async def _on_crash(request: Request, err: Exception) -> JSONResponse:
        return _internal_error(err, f"{request.url.path} failed")

    @app.get("/health")
    async def health() -> JSONResponse:
        metrics = state.engine.metrics()
        ok = metrics["engine_alive"]
        return JSONResponse(status_code=200 if ok else 503,
                            content={"status": "ok" if ok else "engine stopped", "model": state.model_name, **metrics})

    @app.get("/metrics")
    async def metrics() -> dict:
        return state.engine.metrics()

    @app.get("/v1/models")
    async def models() -> dict:
        card = {"id": state.model_name, "object": "model", "created": state.created, "owned_by": "hybridflow",
                "max_model_len": state.max_model_len}
        return {"object": "list", "data": [card]}

    @app.post("/v1/completions")
    async def _completions(request: Request, body: CompletionRequest) -> dict:
        return await completions(state, request, body)

    @app.post("/v1/chat/completions")
    async def _chat(request: Request, body: ChatCompletionRequest) -> dict:
        return await chat_completions(state, request, body)

    @app.post("/generate")
    async def _generate(request: Request, body: GenerateRequest) -> dict:
        return await generate(state, request, body)

    @app.post("/update_weights_from_disk")
    async def _update(body: UpdateWeightsRequest) -> Any:
        return await update_weights(state, body)

    return app
