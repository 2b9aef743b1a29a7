"""``POST /v1/chat/completions``: OpenAI's chat completions, with tools, whole or streamed.

Messages with ``image_url`` content parts (inline ``data:`` images) are rendered by a
vision-language model's processor instead (:mod:`hybridflow.server.images`).

The messages go through the model's chat template; offered tools go to the template, or, for
a template that ignores them, into the system prompt as the agent loop writes them. Tool calls
are read out of the reply with the server's tool parser (``--tool-call-parser``).
"""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import Request
from fastapi.responses import StreamingResponse

from hybridflow.agent.parsers import ToolParser
from hybridflow.inference.batcher_types import GenRequest
from hybridflow.server.checks import BadRequest
from hybridflow.server.engine_calls import (
    in_thread,
    run_requests,
    stream_error,
    stream_reply,
)
from hybridflow.server.images import has_image_parts, image_prompt
from hybridflow.server.request_params import check_common, prompt_params
from hybridflow.server.responses import (
    chat_choice,
    chat_message,
    reply_head,
    text_and_reason,
    usage,
)
from hybridflow.server.schemas import ChatCompletionRequest
from hybridflow.server.state import ServerState
from hybridflow.server.streaming import IncrementalText, events, sse, stream_chunk
from hybridflow.server.tools import (
    calls_as_text,
    check_tools,
    describe_tools,
    template_messages,
)


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
    state: ServerState,
    body: ChatCompletionRequest,
    prompt: list[int],
    queue: asyncio.Queue,
    first: tuple,
    stops: list[str],
    parser: ToolParser | None,
) -> Any:
    """``chat.completion.chunk`` s: a role chunk per choice, content deltas, a last chunk per
    choice with its finish reason. With tools the reply is held back and sent whole at the end
    (content, then ``tool_calls``), since a call block is only known once it is closed."""
    head = reply_head("chatcmpl", "chat.completion.chunk", state.model_name)
    include_usage = bool(body.stream_options and body.stream_options.include_usage)

    def chunk(index: int, delta: dict, reason: str | None = None) -> str:
        return stream_chunk(
            head, {"index": index, "delta": delta, "logprobs": None, "finish_reason": reason}, include_usage
        )

    texts = [IncrementalText(state.codec, stops) for _ in range(body.n)]
    for i in range(body.n):
        yield chunk(i, {"role": "assistant", "content": ""})
    async for _, row, x in events(first, queue, 1):
        if row is not None:
            if parser is None and (delta := texts[row].add(x)):
                yield chunk(row, {"content": delta})
            continue
        if (error := stream_error(x)) is not None:
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
    check_common(state, body)
    check_tools(body.tools, body.tool_choice)
    parser = state.tool_parser if _tools_on(body) else None
    images, positions = None, None
    if has_image_parts(body.messages):
        prompt, images, positions = await in_thread(image_prompt, state.processor, state.model_name, body)
    else:
        prompt = await in_thread(_chat_prompt, state, body)
    params = prompt_params(state, body, prompt, "messages", body.token_limit())
    state.limits.check_request_tokens([params.max_new_tokens], body.n, "max_tokens")
    stops = body.stop_strings()
    top = (body.top_logprobs or 0) if body.logprobs else 0
    gen = GenRequest(
        tuple(prompt), params, top, state.codec.stop_check(stops), body.seed, images=images, prompt_positions=positions
    )
    if body.stream:
        return await stream_reply(
            state, request, [gen], lambda queue, first: _chat_chunks(state, body, prompt, queue, first, stops, parser)
        )
    (outputs,) = await run_requests(state, request, [gen])
    choices = [chat_choice(state.codec, out, i, stops, body.logprobs, parser) for i, out in enumerate(outputs)]
    return {
        **reply_head("chatcmpl", "chat.completion", state.model_name),
        "choices": choices,
        "usage": usage([prompt], [outputs]),
    }
