"""``POST /v1/completions``: OpenAI's text completions, whole or streamed.

A prompt is text, a list of texts, token ids or a list of token-id lists; each becomes one
request of ``n`` responses, all of one HTTP call. Choice ``k * n + row`` is response ``row``
of prompt ``k``.
"""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import Request
from fastapi.responses import StreamingResponse

from hybridflow.inference.batcher_types import GenRequest, SampleOutput
from hybridflow.server.engine_calls import (
    in_thread,
    run_requests,
    stream_error,
    stream_reply,
)
from hybridflow.server.request_params import check_common, prompt_params
from hybridflow.server.responses import (
    completion_choice,
    reply_head,
    text_and_reason,
    usage,
)
from hybridflow.server.schemas import CompletionRequest
from hybridflow.server.state import ServerState
from hybridflow.server.streaming import IncrementalText, events, sse, stream_chunk


def _completion_prompts(state: ServerState, body: CompletionRequest) -> list[list[int]]:
    prompt = body.prompt
    if isinstance(prompt, str):
        return [state.codec.encode(prompt)]
    if isinstance(prompt[0], str):
        state.limits.check_prompts(len(prompt), "prompt")
        return [state.codec.encode(p) for p in prompt]
    if isinstance(prompt[0], int):
        return [list(prompt)]
    state.limits.check_prompts(len(prompt), "prompt")
    return [list(p) for p in prompt]


async def completions(state: ServerState, request: Request, body: CompletionRequest) -> dict | StreamingResponse:
    check_common(state, body)
    prompts = await in_thread(_completion_prompts, state, body)
    stops = body.stop_strings()
    requests = []
    for prompt in prompts:
        params = prompt_params(state, body, prompt, "prompt", body.max_tokens)
        top = body.logprobs or 0
        requests.append(GenRequest(tuple(prompt), params, top, state.codec.stop_check(stops), body.seed))
    state.limits.check_request_tokens([r.params.max_new_tokens for r in requests], body.n, "max_tokens")
    if body.stream:
        return await stream_reply(
            state, request, requests, lambda queue, first: _completion_chunks(state, body, prompts, queue, first, stops)
        )
    results = await run_requests(state, request, requests)
    choices: list[dict[str, Any]] = []
    for outputs in results:
        for out in outputs:
            choices.append(completion_choice(state.codec, out, len(choices), stops, body.logprobs))
    return {
        **reply_head("cmpl", "text_completion", state.model_name),
        "choices": choices,
        "usage": usage(prompts, results),
    }


async def _completion_chunks(
    state: ServerState,
    body: CompletionRequest,
    prompts: list[list[int]],
    queue: asyncio.Queue,
    first: tuple,
    stops: list[str],
) -> Any:
    """``text_completion`` chunks; choice ``k * n + row`` is response ``row`` of prompt ``k``."""
    head = reply_head("cmpl", "text_completion", state.model_name)
    include_usage = bool(body.stream_options and body.stream_options.include_usage)
    texts = {(k, row): IncrementalText(state.codec, stops) for k in range(len(prompts)) for row in range(body.n)}
    results: list[list[SampleOutput]] = [[] for _ in prompts]

    def chunk(index: int, text: str, reason: str | None) -> str:
        return stream_chunk(
            head, {"index": index, "text": text, "finish_reason": reason, "logprobs": None}, include_usage
        )

    async for k, row, x in events(first, queue, len(prompts)):
        if row is not None:
            if delta := texts[k, row].add(x):
                yield chunk(k * body.n + row, delta, None)
            continue
        if (error := stream_error(x)) is not None:
            yield error
            return
        results[k] = x.result()
        for i, out in enumerate(results[k]):
            text, reason = text_and_reason(state.codec, out, stops)
            yield chunk(k * body.n + i, texts[k, i].finish(text), reason)
    if include_usage:
        yield sse({**head, "choices": [], "usage": usage(prompts, results)})
    yield sse("[DONE]")
