"""The FastAPI application: OpenAI-compatible routes, ``/generate``, weights, health, metrics.

Handlers validate and tokenize on the event loop, hand :class:`GenRequest` s to the engine
thread and await their futures, so many requests are in flight at once and share forward
passes. Every client mistake is a 400 with an OpenAI-style body
``{"error": {"message": ..., "type": "invalid_request_error", "param": ..., "code": null}}``;
the server keeps serving.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from hybridflow.server.engine import GenerationEngine
from hybridflow.server.responses import chat_choice, completion_choice, generate_output, usage
from hybridflow.server.schemas import (
    ChatCompletionRequest,
    CompletionRequest,
    GenerateRequest,
    OpenAISampling,
    UpdateWeightsRequest,
)
from hybridflow.server.text import TextCodec
from hybridflow.workers.rollout.continuous import GenRequest, SampleOutput
from hybridflow.workers.rollout.sampling import SamplingParams


class BadRequest(ValueError):
    """A request the server understands but cannot serve (unknown model, too long, ...)."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


@dataclass
class ServerState:
    """What the routes need: the engine, the tokenizer, and the served model's limits.

    ``eos_token_ids`` end every response unless ``ignore_eos``; ``default_max_tokens`` caps a
    reply when the request gives no limit.
    """

    engine: GenerationEngine
    codec: TextCodec
    model_name: str
    max_model_len: int
    eos_token_ids: tuple[int, ...]
    default_max_tokens: int = 512
    created: int = 0


def _error(status: int, message: str, param: str | None = None, kind: str = "invalid_request_error") -> JSONResponse:
    return JSONResponse(
        status_code=status, content={"error": {"message": message, "type": kind, "param": param, "code": None}}
    )


def _validation_message(err: RequestValidationError) -> tuple[str, str | None]:
    parts, param = [], None
    for item in err.errors():
        loc = ".".join(str(p) for p in item["loc"] if p != "body")
        param = param or loc or None
        parts.append(f"{loc}: {item['msg']}" if loc else str(item["msg"]))
    return "; ".join(parts) or "invalid request body", param


# ---- request → GenRequests ------------------------------------------------------------------


def _check_model(state: ServerState, name: str) -> None:
    if name != state.model_name:
        raise BadRequest(f"model {name!r} is not served here; available: {state.model_name!r}", "model")


def _check_ids(state: ServerState, prompt: Sequence[int], param: str) -> None:
    if not prompt:
        raise BadRequest("prompt has no tokens", param)
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


async def _run(state: ServerState, requests: list[GenRequest]) -> list[list[SampleOutput]]:
    futures = [asyncio.wrap_future(state.engine.submit(r)) for r in requests]
    try:
        return list(await asyncio.gather(*futures))
    except ValueError as err:  # the batcher refused it (e.g. n above the batch limit)
        raise BadRequest(str(err)) from err


# ---- routes --------------------------------------------------------------------------------


def _completion_prompts(state: ServerState, body: CompletionRequest) -> list[list[int]]:
    prompt = body.prompt
    if isinstance(prompt, str):
        return [state.codec.encode(prompt)]
    if isinstance(prompt[0], str):
        return [state.codec.encode(p) for p in prompt]  # type: ignore[arg-type]
    if isinstance(prompt[0], int):
        return [list(prompt)]  # type: ignore[arg-type]
    return [list(p) for p in prompt]  # type: ignore[union-attr]


async def completions(state: ServerState, body: CompletionRequest) -> dict:
    _check_model(state, body.model)
    prompts = _completion_prompts(state, body)
    stops = body.stop_strings()
    requests = []
    for prompt in prompts:
        _check_ids(state, prompt, "prompt")
        params = _params(state, body, _budget(state, len(prompt), body.max_tokens, "max_tokens"))
        top = body.logprobs or 0
        requests.append(GenRequest(tuple(prompt), params, top, state.codec.stop_check(stops), body.seed))
    results = await _run(state, requests)
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


async def chat_completions(state: ServerState, body: ChatCompletionRequest) -> dict:
    _check_model(state, body.model)
    try:
        messages = [m.template_dict() for m in body.messages]
        kwargs = dict(body.chat_template_kwargs or {})
        if body.tools:
            kwargs["tools"] = body.tools
        prompt = state.codec.chat_prompt_ids(messages, kwargs)
    except (ValueError, TypeError, KeyError) as err:  # template errors name the message at fault
        raise BadRequest(f"could not apply the chat template: {err}", "messages") from err
    _check_ids(state, prompt, "messages")
    params = _params(state, body, _budget(state, len(prompt), body.token_limit(), "max_tokens"))
    stops = body.stop_strings()
    top = (body.top_logprobs or 0) if body.logprobs else 0
    (outputs,) = await _run(state, [GenRequest(tuple(prompt), params, top, state.codec.stop_check(stops), body.seed)])
    choices = [chat_choice(state.codec, out, i, stops, body.logprobs) for i, out in enumerate(outputs)]
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": state.model_name,
        "choices": choices,
        "usage": usage([prompt], [outputs]),
    }


async def generate(state: ServerState, body: GenerateRequest) -> dict:
    sp = body.sampling_params
    requests = []
    for prompt in body.prompts():
        _check_ids(state, prompt, "input_ids")
        _budget(state, len(prompt), sp.max_new_tokens, "max_new_tokens")
        params = _sampling(state, sp.max_new_tokens, sp.temperature, sp.top_k, sp.top_p, sp.n, sp.ignore_eos,
                           sp.stop_token_ids)
        requests.append(GenRequest(tuple(prompt), params, body.top_logprobs, None, sp.seed))
    results = await _run(state, requests)
    outputs = [generate_output(i, out) for i, group in enumerate(results) for out in group]
    return {"model": state.model_name, "outputs": outputs, "usage": usage(body.prompts(), results)}


async def update_weights(state: ServerState, body: UpdateWeightsRequest) -> dict:
    """Reload weights once the running requests are done (see :class:`GenerationEngine`)."""
    try:
        copied = await asyncio.wrap_future(state.engine.update_weights_from_disk(body.model_path))
    except ValueError as err:
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

    @app.exception_handler(RequestValidationError)
    async def _on_invalid(request: Request, err: RequestValidationError) -> JSONResponse:
        message, param = _validation_message(err)
        return _error(400, message, param)

    @app.exception_handler(BadRequest)
    async def _on_bad(request: Request, err: BadRequest) -> JSONResponse:
        return _error(400, str(err), err.param)

    @app.exception_handler(Exception)
    async def _on_crash(request: Request, err: Exception) -> JSONResponse:
        return _error(500, f"{type(err).__name__}: {err}", kind="server_error")

    @app.get("/health")
    async def health() -> dict:
        metrics = state.engine.metrics()
        return {"status": "ok", "model": state.model_name, **metrics}

    @app.get("/metrics")
    async def metrics() -> dict:
        return state.engine.metrics()

    @app.get("/v1/models")
    async def models() -> dict:
        card = {"id": state.model_name, "object": "model", "created": state.created, "owned_by": "hybridflow",
                "max_model_len": state.max_model_len}
        return {"object": "list", "data": [card]}

    @app.post("/v1/completions")
    async def _completions(body: CompletionRequest) -> dict:
        return await completions(state, body)

    @app.post("/v1/chat/completions")
    async def _chat(body: ChatCompletionRequest) -> dict:
        return await chat_completions(state, body)

    @app.post("/generate")
    async def _generate(body: GenerateRequest) -> dict:
        return await generate(state, body)

    @app.post("/update_weights_from_disk")
    async def _update(body: UpdateWeightsRequest) -> dict:
        return await update_weights(state, body)

    return app
