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
import dataclasses
import itertools
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
from fastapi.responses import JSONResponse, StreamingResponse

from hybridflow.agent.parsers import ToolParser, get_tool_parser
from hybridflow.inference.continuous import GenRequest, SampleOutput
from hybridflow.inference.engine import GenerationEngine, RequestRefused, ShuttingDown
from hybridflow.inference.sampling import NonFiniteLogitsError, SamplingParams
from hybridflow.inference.weights import WeightsRejected, folder_under_root
from hybridflow.server.checks import BadRequest, ServerLimits, check_text
from hybridflow.server.control import (
    CONTROL_PATHS,
    CONTROL_TOKEN_HINT,
    UPDATE_FROM_DISK_PATH,
    UPDATE_WEIGHTS_PATH,
    WeightUpload,
    add_control_routes,
)
from hybridflow.server.errors import ClientDisconnected, GenerationError, error_response, install_error_handlers
from hybridflow.server.responses import (
    chat_choice,
    chat_message,
    completion_choice,
    generate_output,
    text_and_reason,
    usage,
)
from hybridflow.server.schemas import (
    ChatCompletionRequest,
    CompletionRequest,
    GenerateRequest,
    OpenAISampling,
    UpdateWeightsRequest,
)
from hybridflow.server.security import RequestGuard, RouteToken, default_allowed_hosts
from hybridflow.server.streaming import IncrementalText, events, sse, watch_futures, with_callbacks
from hybridflow.server.text import TextCodec
from hybridflow.server.tools import calls_as_text, check_tools, describe_tools, template_messages

logger = logging.getLogger("hybridflow.server")
T = TypeVar("T")
_CALLS = itertools.count()  # one group per HTTP call: the batcher shares rows fairly between them


@dataclass
class ServerState:
    """What the routes need: the engine, the tokenizer, the served model's limits, and the
    server's policy.

    ``eos_token_ids`` end every response unless ``ignore_eos``; ``default_max_tokens`` caps a
    reply when the request gives no limit; ``limits`` caps each request; ``weights_root`` is
    the only folder ``/update_weights_from_disk`` reads from (``None``: the route is off);
    ``allowed_hosts`` / ``api_key`` are checked on every request (see
    :mod:`hybridflow.server.security`); ``tool_parser`` reads tool calls out of chat replies
    when a request offers ``tools`` (``--tool-call-parser``); ``control_routes`` turns on
    the trainer's routes of :mod:`hybridflow.server.control` (``--control-routes``), whose
    weight pushes may be up to ``max_weight_bucket_bytes`` per request; ``control_token``
    (when set) is the bearer token those routes and ``/update_weights_from_disk`` need.
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
    tool_parser: ToolParser = field(default_factory=lambda: get_tool_parser("hermes"))
    control_routes: bool = False
    max_weight_bucket_bytes: int = 512 * 1024 * 1024
    weight_upload: WeightUpload | None = None  # the buckets of the push in progress
    control_token: str | None = None


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


async def _run(
    state: ServerState, request: Request, requests: list[GenRequest], prompt_logprobs: int | None = None
) -> list[list[SampleOutput]]:
    """Submit, await all outputs; cancel everything if the client leaves or one request fails."""
    futures: list[Future] = [state.engine.submit(r, prompt_logprobs) for r in _one_call(requests)]
    gathered = asyncio.gather(*(asyncio.wrap_future(f) for f in futures))
    watcher = asyncio.ensure_future(_until_disconnected(request))
    try:
        await asyncio.wait({gathered, watcher}, return_when=asyncio.FIRST_COMPLETED)
        if not gathered.done():
            raise ClientDisconnected()
        return list(gathered.result())
    except ClientDisconnected:
        raise
    except Exception as err:  # noqa: BLE001 - worded for the client below
        raise _client_error(err) from err
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


def _client_error(err: Exception) -> Exception:
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
    leaves meanwhile cancels everything, as in :func:`_run`."""
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
            raise _client_error(err) from err
        return futures, queue, item
    except BaseException:
        for future in futures:
            state.engine.cancel(future)
        raise
    finally:
        watcher.cancel()
        if not first.done():
            first.cancel()


def _stream_error(future: Future) -> str | None:
    """An SSE error event for a request that failed mid-stream, or None."""
    err = future.exception()
    if err is None:
        return None
    logger.error("streamed request failed: %s: %s", type(err).__name__, err, exc_info=err)
    message = str(err) if isinstance(err, NonFiniteLogitsError | ShuttingDown) else "generation failed (internal error)"
    return sse({"error": {"message": message, "type": "server_error", "param": None, "code": None}})


def _streaming_response(state: ServerState, body: Any, futures: list[Future]) -> StreamingResponse:
    async def guarded() -> Any:
        try:
            async for chunk in body:
                yield chunk
        finally:  # done, failed, or the client left (Starlette cancels the stream): stop generating
            for future in futures:
                state.engine.cancel(future)

    return StreamingResponse(guarded(), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


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


async def completions(state: ServerState, request: Request, body: CompletionRequest) -> dict | StreamingResponse:
    _check_common(state, body)
    prompts = await _in_thread(_completion_prompts, state, body)
    stops = body.stop_strings()
    requests = []
    for prompt in prompts:
        _check_ids(state, prompt, "prompt")
        params = _params(state, body, _budget(state, len(prompt), body.max_tokens, "max_tokens"))
        top = body.logprobs or 0
        requests.append(GenRequest(tuple(prompt), params, top, state.codec.stop_check(stops), body.seed))
    state.limits.check_request_tokens([r.params.max_new_tokens for r in requests], body.n, "max_tokens")
    if body.stream:
        futures, queue, first = await _start_stream(state, request, requests)
        chunks = _completion_chunks(state, body, prompts, queue, first, stops)
        return _streaming_response(state, chunks, futures)
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


async def _completion_chunks(
    state: ServerState, body: CompletionRequest, prompts: list[list[int]], queue: asyncio.Queue, first: tuple,
    stops: list[str],
) -> Any:
    """``text_completion`` chunks; choice ``k * n + row`` is response ``row`` of prompt ``k``."""
    head = {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": int(time.time()),
            "model": state.model_name}
    include_usage = bool(body.stream_options and body.stream_options.include_usage)
    texts = {(k, row): IncrementalText(state.codec, stops) for k in range(len(prompts)) for row in range(body.n)}
    results: list[list[SampleOutput]] = [[] for _ in prompts]

    def chunk(index: int, text: str, reason: str | None) -> str:
        extra = {"usage": None} if include_usage else {}
        return sse({**head, "choices": [{"index": index, "text": text, "finish_reason": reason, "logprobs": None}],
                    **extra})

    async for k, row, x in events(first, queue, len(prompts)):
        if row is not None:
            if delta := texts[k, row].add(x):
                yield chunk(k * body.n + row, delta, None)
            continue
        if (error := _stream_error(x)) is not None:
            yield error
            return
        results[k] = x.result()
        for i, out in enumerate(results[k]):
            text, reason = text_and_reason(state.codec, out, stops)
            yield chunk(k * body.n + i, texts[k, i].finish(text), reason)
    if include_usage:
        yield sse({**head, "choices": [], "usage": usage(prompts, results)})
    yield sse("[DONE]")


def _tools_on(body: ChatCompletionRequest) -> bool:
    """The request offers tools and lets the model call them (``tool_choice`` not ``"none"``)."""
    return bool(body.tools) and body.tool_choice != "none"


def _chat_prompt(state: ServerState, body: ChatCompletionRequest) -> list[int]:
    """The prompt ids. Tools go to the template; a template that ignores them (the rendering
    does not change with them) gets them described in the system prompt as the agent loop
    does, and earlier assistant tool calls written into their turns in the parser's format.
    With ``tool_choice="none"`` the tools are left out of the prompt."""
    try:
        messages = template_messages([m.template_dict() for m in body.messages])
    except ValueError as err:
        raise BadRequest(str(err), "messages") from err
    kwargs = dict(body.chat_template_kwargs or {})
    codec, parser = state.codec, state.tool_parser
    try:
        if body.tools:
            kwargs.pop("tools", None)  # the request's own tools win
            as_text = calls_as_text(messages, parser)
            with_tools = codec.chat_prompt_ids(as_text, {**kwargs, "tools": body.tools})
            if with_tools != codec.chat_prompt_ids(as_text, kwargs):  # the template renders tools
                if _tools_on(body):
                    return codec.chat_prompt_ids(messages, {**kwargs, "tools": body.tools})
                return codec.chat_prompt_ids(messages, kwargs)
            if _tools_on(body):
                as_text = describe_tools(as_text, body.tools, parser)
            return codec.chat_prompt_ids(as_text, kwargs)
        return codec.chat_prompt_ids(messages, kwargs)
    except NotImplementedError as err:  # a parser that cannot write earlier calls as text
        raise BadRequest(str(err), "messages") from err
    except ValueError as err:  # TextCodec words template failures for the client
        raise BadRequest(f"could not apply the chat template: {err}", "messages") from err


async def _chat_chunks(
    state: ServerState, body: ChatCompletionRequest, prompt: list[int], queue: asyncio.Queue, first: tuple,
    stops: list[str], parser: ToolParser | None,
) -> Any:
    """``chat.completion.chunk`` s: a role chunk per choice, content deltas, a last chunk per
    choice with its finish reason. With tools the reply is held back and sent whole at the end
    (content, then ``tool_calls``), since a call block is only known once it is closed."""
    head = {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion.chunk", "created": int(time.time()),
            "model": state.model_name}
    include_usage = bool(body.stream_options and body.stream_options.include_usage)

    def chunk(index: int, delta: dict, reason: str | None = None) -> str:
        extra = {"usage": None} if include_usage else {}
        return sse({**head, "choices": [{"index": index, "delta": delta, "logprobs": None, "finish_reason": reason}],
                    **extra})

    texts = [IncrementalText(state.codec, stops) for _ in range(body.n)]
    for i in range(body.n):
        yield chunk(i, {"role": "assistant", "content": ""})
    async for _, row, x in events(first, queue, 1):
        if row is not None:
            if parser is None and (delta := texts[row].add(x)):
                yield chunk(row, {"content": delta})
            continue
        if (error := _stream_error(x)) is not None:
            yield error
            return
        outputs = x.result()
        for i, out in enumerate(outputs):
            text, reason = text_and_reason(state.codec, out, stops)
            if parser is None:
                if rest := texts[i].finish(text):
                    yield chunk(i, {"content": rest})
            else:
                message, reason = chat_message(text, reason, parser)
                if message["content"]:
                    yield chunk(i, {"content": message["content"]})
                if message.get("tool_calls"):
                    calls = [{"index": j, **call} for j, call in enumerate(message["tool_calls"])]
                    yield chunk(i, {"tool_calls": calls})
            yield chunk(i, {}, reason)
        if include_usage:
            yield sse({**head, "choices": [], "usage": usage([prompt], [outputs])})
    yield sse("[DONE]")


async def chat_completions(
    state: ServerState, request: Request, body: ChatCompletionRequest
) -> dict | StreamingResponse:
    _check_common(state, body)
    check_tools(body.tools, body.tool_choice)
    parser = state.tool_parser if _tools_on(body) else None
    prompt = await _in_thread(_chat_prompt, state, body)
    _check_ids(state, prompt, "messages")
    params = _params(state, body, _budget(state, len(prompt), body.token_limit(), "max_tokens"))
    state.limits.check_request_tokens([params.max_new_tokens], body.n, "max_tokens")
    stops = body.stop_strings()
    top = (body.top_logprobs or 0) if body.logprobs else 0
    gen = GenRequest(tuple(prompt), params, top, state.codec.stop_check(stops), body.seed)
    if body.stream:
        futures, queue, first = await _start_stream(state, request, [gen])
        return _streaming_response(state, _chat_chunks(state, body, prompt, queue, first, stops, parser), futures)
    (outputs,) = await _run(state, request, [gen])
    choices = [chat_choice(state.codec, out, i, stops, body.logprobs, parser) for i, out in enumerate(outputs)]
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
    for prompt in prompts:
        _check_ids(state, prompt, "input_ids")
    if sp.max_new_tokens == 0:
        return await _score_prompts(state, body, prompts)
    requests = []
    for prompt in prompts:
        _budget(state, len(prompt), sp.max_new_tokens, "max_new_tokens")
        params = _sampling(state, sp.max_new_tokens, sp.temperature, sp.top_k, sp.top_p, sp.n, sp.ignore_eos,
                           sp.stop_token_ids)
        requests.append(GenRequest(tuple(prompt), params, body.top_logprobs, None, sp.seed))
    state.limits.check_request_tokens([sp.max_new_tokens] * len(requests), sp.n, "sampling_params.max_new_tokens")
    results = await _run(state, request, requests, body.prompt_logprobs)
    outputs = [generate_output(i, out) for i, group in enumerate(results) for out in group]
    return {"model": state.model_name, "outputs": outputs, "usage": usage(prompts, results)}


async def _score_prompts(state: ServerState, body: GenerateRequest, prompts: list[list[int]]) -> dict:
    """``max_new_tokens`` = 0: the prompts' log-probs only (a teacher scoring a student's tokens)."""
    if body.prompt_logprobs is None:
        raise BadRequest("max_new_tokens=0 generates nothing: set prompt_logprobs to score the prompt", "max_new_tokens")
    scores = [await asyncio.wrap_future(state.engine.score_prompt(p, body.prompt_logprobs)) for p in prompts]
    outputs = [
        generate_output(i, SampleOutput(finish_reason="length", prompt_logprobs=lp, prompt_top_logprobs=top))
        for i, (lp, top) in enumerate(scores)
    ]
    return {"model": state.model_name, "outputs": outputs, "usage": usage(prompts, [[] for _ in prompts])}


async def update_weights(state: ServerState, body: UpdateWeightsRequest) -> dict | JSONResponse:
    """Reload weights from a folder inside the weights root, once the running requests are done."""
    if state.weights_root is None:
        return error_response(403, "weight updates are off: start the server with --weights-root DIR to allow loading "
                      "weights from folders inside DIR", "model_path")
    check_text(body.model_dump())
    try:
        folder = folder_under_root(state.weights_root, body.model_path)
        copied = await asyncio.wrap_future(state.engine.update_weights_from_disk(folder, body.model_path, body.version))
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
    body_limits = {UPDATE_WEIGHTS_PATH: state.max_weight_bucket_bytes} if state.control_routes else {}
    token = RouteToken(state.control_token, CONTROL_PATHS, CONTROL_TOKEN_HINT) if state.control_token else None
    app.add_middleware(RequestGuard, allowed_hosts=state.allowed_hosts, api_key=state.api_key,
                       max_body_bytes=state.limits.max_body_bytes, body_limits=body_limits,
                       body_types={UPDATE_WEIGHTS_PATH: "application/octet-stream"}, route_token=token)

    install_error_handlers(app)

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

    add_control_routes(app, state)
    return app
