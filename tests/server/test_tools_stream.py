"""Tool calls and ``stream=true`` on the OpenAI routes.

Tool-call parsing is checked on the reply-building function with fixed text and through the
HTTP route with a scripted engine (a fixed reply); the prompt side with the tiny model's ChatML
template (which ignores ``tools``, so they are described in the system prompt). Streaming runs
on the real server process with the official ``openai`` client: the deltas concatenate to the
non-streamed greedy text. A client that leaves mid-stream cancels its generation.
"""

from __future__ import annotations

import asyncio
import json
import urllib.request
from concurrent.futures import Future

import openai
import pytest

from hybridflow.agent.parsers import get_tool_parser
from hybridflow.inference.batcher_types import SampleOutput
from hybridflow.server.chat import _chat_prompt
from hybridflow.server.responses import chat_message
from hybridflow.server.schemas import ChatCompletionRequest
from hybridflow.server.streaming import IncrementalText
from hybridflow.server.text import TextCodec
from tests.server.test_app import TIMEOUT_S, asgi_post, served  # noqa: F401 - fixture

pytestmark = pytest.mark.usefixtures("one_torch_thread")
HERMES = get_tool_parser("hermes")
CALC = {"type": "function", "function": {
    "name": "calculator", "description": "Evaluates arithmetic.",
    "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]}}}
MESSAGES = [{"role": "user", "content": "What is 12*7?"}]


# ---- replies → tool_calls ------------------------------------------------------------------


def test_calls_become_openai_tool_calls_and_the_rest_is_content():
    text = ('Let me compute. <tool_call>\n{"name": "calculator", "arguments": {"expression": "12*7"}}\n</tool_call>'
            '<tool_call>{"name": "calculator", "arguments": "{\\"expression\\": \\"1+1\\"}"}</tool_call>')
    message, reason = chat_message(text, "stop", HERMES)
    assert reason == "tool_calls" and message["content"] == "Let me compute."
    calls = message["tool_calls"]
    assert [c["type"] for c in calls] == ["function", "function"]
    assert all(c["id"].startswith("call_") for c in calls) and calls[0]["id"] != calls[1]["id"]
    assert calls[0]["function"] == {"name": "calculator", "arguments": json.dumps({"expression": "12*7"})}
    assert json.loads(calls[1]["function"]["arguments"]) == {"expression": "1+1"}


def test_only_calls_gives_null_content_and_malformed_or_thinking_blocks_stay_text():
    message, reason = chat_message('<tool_call>{"name": "calculator"}</tool_call>', "stop", HERMES)
    assert message["content"] is None and reason == "tool_calls"
    assert json.loads(message["tool_calls"][0]["function"]["arguments"]) == {}
    bad = 'a <tool_call>{not json}</tool_call> b'
    assert chat_message(bad, "stop", HERMES) == ({"role": "assistant", "content": bad}, "stop")
    think = '<think>maybe <tool_call>{"name": "x"}</tool_call></think> done <tool_call>{bad</tool_call>'
    assert chat_message(think, "length", HERMES) == ({"role": "assistant", "content": think}, "length")
    mixed = '<think>t</think>ok <tool_call>{"name": "calculator"}</tool_call> <tool_call>[1]</tool_call>'
    message, _ = chat_message(mixed, "stop", HERMES)
    assert message["content"] == "<think>t</think>ok  <tool_call>[1]</tool_call>"
    assert [c["function"]["name"] for c in message["tool_calls"]] == ["calculator"]
    assert chat_message("plain", "stop", None) == ({"role": "assistant", "content": "plain"}, "stop")


def _scripted(state, text: str) -> list:
    """The engine answers every request with ``text`` (its tokens), without running the model."""
    ids = state.codec.encode(text, add_special_tokens=False)
    prompts = []

    def submit(request, prompt_logprobs=None):
        prompts.append(request.prompt_ids)
        future: Future = Future()
        future.set_result([SampleOutput(token_ids=list(ids), logprobs=[0.0] * len(ids),
                                        top_logprobs=[[] for _ in ids], finish_reason="stop")])
        return future

    state.engine.submit = submit
    return prompts


def test_the_chat_route_returns_tool_calls_and_tools_reach_the_prompt(served):
    state, app = served
    reply_text = 'Sure.<tool_call>{"name": "calculator", "arguments": {"expression": "12*7"}}</tool_call>'
    prompts = _scripted(state, reply_text)
    body = {"model": "tiny", "messages": MESSAGES, "tools": [CALC], "temperature": 0, "max_tokens": 5}
    status, reply = asyncio.run(asgi_post(app, "/v1/chat/completions", body))
    assert status == 200, reply
    choice = reply["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] == "Sure."
    assert choice["message"]["tool_calls"][0]["function"] == {"name": "calculator",
                                                              "arguments": '{"expression": "12*7"}'}
    prompt = state.codec.decode(prompts[0], skip_special_tokens=False)
    assert '"name": "calculator"' in prompt and "<tool_call>" in prompt  # described in the system prompt
    # tool_choice="none": no tools in the prompt, the reply is plain text
    status, reply = asyncio.run(asgi_post(app, "/v1/chat/completions", {**body, "tool_choice": "none"}))
    assert status == 200 and reply["choices"][0]["finish_reason"] == "stop"
    assert "tool_calls" not in reply["choices"][0]["message"]
    assert "calculator" not in state.codec.decode(prompts[1], skip_special_tokens=False)
    # streamed with tools: held back, sent whole at the end
    status, chunks = asyncio.run(asgi_stream(app, "/v1/chat/completions", {**body, "stream": True}))
    assert status == 200 and chunks[-1] == "[DONE]"
    deltas = [json.loads(c)["choices"][0] for c in chunks[:-1]]
    assert deltas[0]["delta"] == {"role": "assistant", "content": ""}
    assert "".join(d["delta"].get("content") or "" for d in deltas) == "Sure."
    (calls,) = [d["delta"]["tool_calls"] for d in deltas if "tool_calls" in d["delta"]]
    assert calls[0]["index"] == 0 and calls[0]["function"]["name"] == "calculator"
    assert deltas[-1]["finish_reason"] == "tool_calls" and deltas[-1]["delta"] == {}


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "calculator"}}, "sometimes"])
def test_unsupported_tool_choice_and_bad_tools_are_400(served, choice):
    _, app = served
    body = {"model": "tiny", "messages": MESSAGES, "tools": [CALC], "tool_choice": choice}
    status, reply = asyncio.run(asgi_post(app, "/v1/chat/completions", body))
    assert status == 400 and reply["error"]["param"] == "tool_choice" and "auto" in reply["error"]["message"]
    status, reply = asyncio.run(asgi_post(app, "/v1/chat/completions", {**body, "tool_choice": "auto",
                                                                           "tools": [{"type": "code"}]}))
    assert status == 400 and reply["error"]["param"] == "tools.0"


def test_a_tool_conversation_renders_with_calls_written_in_the_parsers_format(served):
    state, _ = served
    history = [*MESSAGES,
               {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function", "function": {
                   "name": "calculator", "arguments": '{"expression": "12*7"}'}}]},
               {"role": "tool", "tool_call_id": "call_1", "content": "84"}]
    body = ChatCompletionRequest.model_validate({"model": "tiny", "messages": history, "tools": [CALC]})
    text = state.codec.decode(_chat_prompt(state, body), skip_special_tokens=False)
    assert '<tool_call>\n{"name": "calculator", "arguments": {"expression": "12*7"}}\n</tool_call>' in text
    assert "<|im_start|>tool\n84<|im_end|>" in text and text.endswith("<|im_start|>assistant\n")
    assert text.index("<tools>") < text.index("What is 12*7?")


# ---- streaming -----------------------------------------------------------------------------


async def asgi_stream(app, path: str, body: dict, disconnect_after: int | None = None) -> tuple[int, list[str]]:
    """POST ``body``; the SSE ``data:`` payloads. ``disconnect_after``: leave after that many events."""
    data = json.dumps(body).encode()
    scope = {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": "1.1",
             "method": "POST", "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": b"",
             "root_path": "", "headers": [(b"host", b"127.0.0.1:8000"), (b"content-type", b"application/json"),
                                          (b"content-length", str(len(data)).encode())],
             "client": ("127.0.0.1", 40000), "server": ("127.0.0.1", 8000)}
    gone, body_sent, sent, events = asyncio.Event(), False, [], []

    async def receive():
        nonlocal body_sent
        if not body_sent:
            body_sent = True
            return {"type": "http.request", "body": data, "more_body": False}
        await gone.wait()
        return {"type": "http.disconnect"}

    async def send(message):
        sent.append(message)
        if message["type"] == "http.response.body":
            events.extend(e.removeprefix("data: ") for e in message["body"].decode().split("\n\n") if e)
            if disconnect_after is not None and len(events) >= disconnect_after:
                gone.set()

    await app(scope, receive, send)
    return sent[0]["status"], events


def test_incremental_text_keeps_multibyte_characters_whole_and_holds_back_stop_strings():
    from hybridflow.models.tiny import build_tiny_tokenizer

    codec = TextCodec(build_tiny_tokenizer())
    text = "Grüße 😀 naïve — 日本 done"
    ids = codec.encode(text, add_special_tokens=False)
    inc = IncrementalText(codec)
    deltas = [inc.add(t) for t in ids]
    assert "".join(deltas) + inc.finish(codec.decode(ids)) == codec.decode(ids)
    assert not any("\ufffd" in d for d in deltas)
    inc = IncrementalText(codec, ["日本"])
    released = "".join(inc.add(t) for t in ids)
    assert "日" not in released and released == text[: len(released)]


def test_a_client_that_leaves_a_stream_cancels_its_generation(served):
    state, app = served
    body = {"model": "tiny", "prompt": [5, 6], "max_tokens": 500, "temperature": 0, "ignore_eos": True,
            "stream": True}
    status, events = asyncio.run(asgi_stream(app, "/v1/completions", body, disconnect_after=3))
    assert status == 200 and "[DONE]" not in events
    # the inbox is first in, first out: once a later request is answered, the cancel was applied
    follow_up = asyncio.run(asgi_post(app, "/generate", {"input_ids": [5], "sampling_params": {"max_new_tokens": 2}}))
    assert follow_up[0] == 200
    metrics = state.engine.metrics()
    assert metrics["requests_cancelled"] == 1 and metrics["running_requests"] == 0
    assert metrics["tokens_generated"] < 500


def test_stream_refusals_are_plain_400s(served):
    _, app = served
    for path, extra in (("/v1/completions", {"prompt": "hi", "logprobs": 1}),
                        ("/v1/chat/completions", {"messages": MESSAGES, "logprobs": True})):
        status, reply = asyncio.run(asgi_post(app, path, {"model": "tiny", "stream": True, **extra}))
        assert status == 400 and "stream" in reply["error"]["message"]
    status, reply = asyncio.run(asgi_post(app, "/v1/completions", {"model": "tiny", "prompt": "hi",
                                                                   "stream_options": {"include_usage": True}}))
    assert status == 400 and "stream=true" in reply["error"]["message"]


# ---- the real server with the openai client ------------------------------------------------


@pytest.fixture(scope="module")
def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key=server.api_key, max_retries=0, timeout=60)


def test_streamed_chat_equals_the_non_streamed_greedy_reply(client):
    kwargs = {"model": "tiny-llama", "messages": [{"role": "user", "content": "Hi there"}], "temperature": 0,
              "max_tokens": 24}
    whole = client.chat.completions.create(**kwargs)
    stream = client.chat.completions.create(**kwargs, stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content and len(text) > 0
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == whole.choices[0].finish_reason
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    assert sum(1 for c in chunks if c.choices and c.choices[0].delta.content) > 1  # really token by token


def test_streamed_completions_with_n_and_stop_equal_the_non_streamed_ones(client):
    kwargs = {"model": "tiny-llama", "prompt": ["Hello", "The sky"], "temperature": 0, "max_tokens": 16, "n": 2}
    whole = client.completions.create(**kwargs)
    texts: dict[int, str] = {}
    reasons: dict[int, str] = {}
    for chunk in client.completions.create(**kwargs, stream=True):
        for choice in chunk.choices:
            texts[choice.index] = texts.get(choice.index, "") + choice.text
            if choice.finish_reason:
                reasons[choice.index] = choice.finish_reason
    assert texts == {c.index: c.text for c in whole.choices}
    assert reasons == {c.index: c.finish_reason for c in whole.choices}
    stop = whole.choices[0].text[3:5]
    if stop.strip():
        cut = client.completions.create(**{**kwargs, "stop": [stop]})
        streamed = "".join(c.choices[0].text for c in client.completions.create(
            **{**kwargs, "prompt": kwargs["prompt"][0], "n": 1, "stop": [stop]}, stream=True) if c.choices)
        assert streamed == cut.choices[0].text and stop not in streamed


def test_the_stream_ends_with_done(server):
    body = {"model": "tiny-llama", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, "stream": True}
    req = urllib.request.Request(server.base_url + "/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json",
                                          "Authorization": f"Bearer {server.api_key}"})
    with urllib.request.urlopen(req, timeout=TIMEOUT_S) as resp:
        assert resp.headers["Content-Type"].startswith("text/event-stream")
        raw = resp.read().decode()
    events = [e for e in raw.split("\n\n") if e]
    assert all(e.startswith("data: ") for e in events) and events[-1] == "data: [DONE]"
    assert json.loads(events[-2].removeprefix("data: "))["choices"][0]["finish_reason"] in ("stop", "length")


def test_the_openai_client_reads_tool_calls_and_sends_a_tool_conversation(client):
    reply = client.chat.completions.create(
        model="tiny-llama", temperature=0, max_tokens=8, tools=[CALC], tool_choice="auto",
        messages=[*MESSAGES,
                  {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function",
                   "function": {"name": "calculator", "arguments": '{"expression": "12*7"}'}}]},
                  {"role": "tool", "tool_call_id": "call_1", "content": "84"}])
    # the random tiny model writes no call; the route still answers in the tool-aware shape
    assert reply.choices[0].finish_reason in ("stop", "length", "tool_calls")
    with pytest.raises(openai.BadRequestError, match="tool_choice"):
        client.chat.completions.create(model="tiny-llama", messages=MESSAGES, tools=[CALC], tool_choice="required")


