"""The request guard (Host header, API key, body size), text checks, per-request caps and the
sampling ranges of the request schemas — pure functions and a raw ASGI call, no server."""

from __future__ import annotations

import asyncio
import json
import re

import pydantic
import pytest

from hybridflow.server.checks import BadRequest, ServerLimits, check_text
from hybridflow.server.schemas import (
    ChatCompletionRequest,
    CompletionRequest,
    GenerateRequest,
)
from hybridflow.server.security import (
    ANY_IP,
    BodyTooLarge,
    RequestGuard,
    default_allowed_hosts,
    host_allowed,
    parse_allowed_hosts,
    split_host_header,
)


def _call(guard_kwargs: dict, headers: dict[str, str], chunks: list[bytes] = (b"{}",)) -> tuple[int, dict, list]:
    """One HTTP request through a RequestGuard around an app that reads the body and answers 200."""
    seen: list[bytes] = []

    async def app(scope, receive, send):
        while True:
            message = await receive()
            seen.append(message.get("body", b""))
            if not message.get("more_body"):
                break
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b'{"ok": true}'})

    guard = RequestGuard(app, **{"allowed_hosts": default_allowed_hosts("127.0.0.1"), "api_key": None,
                                 "max_body_bytes": 100, **guard_kwargs})
    headers = {"content-type": "application/json", **headers}  # the guard refuses other body types (415)
    scope = {"type": "http", "method": "POST", "path": "/v1/completions",
             "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()]}
    queue = [{"type": "http.request", "body": c, "more_body": i < len(chunks) - 1} for i, c in enumerate(chunks)]
    sent: list[dict] = []

    async def receive():
        return queue.pop(0)

    async def send(message):
        sent.append(message)

    asyncio.run(guard(scope, receive, send))
    body = json.loads(b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body"))
    return sent[0]["status"], body, seen


@pytest.mark.parametrize("host", ["127.0.0.1:8000", "localhost:8000", "LOCALHOST.", "[::1]:8000", "127.0.0.1"])
def test_loopback_names_are_answered(host):
    assert _call({}, {"host": host})[0] == 200


@pytest.mark.parametrize("host", ["evil.example:8000", "127.0.0.1.nip.io", "", "[::2]:80", "localhost.evil.com"])
def test_other_host_headers_are_refused_before_the_app_runs(host):
    status, body, seen = _call({}, {"host": host})
    assert status == 400 and body["error"]["code"] == "invalid_host" and seen == []


def test_allowed_hosts_for_each_kind_of_bind_address():
    assert default_allowed_hosts("127.0.0.1") == {"localhost", "127.0.0.1", "::1"}
    assert default_allowed_hosts("192.168.1.7") == {"192.168.1.7"}
    assert default_allowed_hosts("gpu7.lan") == {"gpu7.lan"}
    wildcard = default_allowed_hosts("0.0.0.0")
    assert ANY_IP in wildcard and host_allowed("10.0.0.3", wildcard) and host_allowed("::1", wildcard)
    assert not host_allowed("attacker.example", wildcard)
    assert parse_allowed_hosts("A.lan, b.lan", "127.0.0.1") == {"a.lan", "b.lan"}
    assert host_allowed("anything", parse_allowed_hosts("*", "127.0.0.1"))
    assert split_host_header("[0:0::1]:9") == "::1" and split_host_header("Name.Lan:80") == "name.lan"
    with pytest.raises(ValueError, match="empty"):
        parse_allowed_hosts(" , ", "127.0.0.1")


def test_api_key_is_required_when_set():
    key = {"api_key": "s3cret"}
    assert _call(key, {"host": "localhost", "authorization": "Bearer s3cret"})[0] == 200
    assert _call(key, {"host": "localhost", "authorization": "bearer s3cret"})[0] == 200
    wrong = ({}, {"authorization": "Bearer wrong"}, {"authorization": "s3cret"}, {"authorization": "Basic s3cret"})
    for header in wrong:
        status, body, seen = _call(key, {"host": "localhost", **header})
        assert status == 401 and body["error"]["code"] == "invalid_api_key" and seen == []


def test_bodies_above_the_limit_are_refused():
    status, body, seen = _call({}, {"host": "localhost", "content-length": "101"})
    assert status == 413 and "limit of 100 bytes" in body["error"]["message"] and seen == []
    assert _call({}, {"host": "localhost", "content-length": "100"}, [b"x" * 100])[0] == 200
    # chunked: no length up front; the route sees an error once the bytes pass the limit
    with pytest.raises(BodyTooLarge):
        _call({}, {"host": "localhost"}, [b"x" * 60, b"x" * 60])


def test_text_with_nul_or_lone_surrogates_is_named():
    check_text({"messages": [{"role": "user", "content": "fine \u00e9 \U0001f600"}]})
    cases = [
        ({"prompt": "a\x00b"}, "prompt", "NUL character"),
        ({"messages": [{"role": "user", "content": "x"}, {"role": "user", "content": "a\ud800"}]},
         "messages.1.content", "lone UTF-16 surrogate (U+D800)"),
        ({"messages": [{"role": "user", "content": [{"type": "text", "text": "\udfff"}]}]},
         "messages.0.content.0.text", "U+DFFF"),
        ({"chat_template_kwargs": {"bad\x00key": 1}}, "chat_template_kwargs.bad\x00key", "NUL"),
    ]
    for body, param, problem in cases:
        with pytest.raises(BadRequest, match=re.escape(problem)) as info:
            check_text(body)
        assert info.value.param == param


def test_per_request_caps():
    limits = ServerLimits(max_n=4, max_prompts=2, max_stop=2, max_stop_chars=5, max_prompt_tokens=10)
    limits.check_n(4)
    with pytest.raises(BadRequest, match="n=5 is above this server's limit of 4"):
        limits.check_n(5)
    with pytest.raises(BadRequest, match="3 prompts in one request; this server takes at most 2"):
        limits.check_prompts(3, "prompt")
    with pytest.raises(BadRequest, match="3 stop strings given"):
        limits.check_stops(["a", "b", "c"], "stop")
    with pytest.raises(BadRequest, match="3 stop token ids given"):
        limits.check_stops([1, 2, 3], "sampling_params.stop_token_ids")
    with pytest.raises(BadRequest, match="stop string of 6 characters"):
        limits.check_stops(["abcdef"], "stop")
    with pytest.raises(BadRequest, match="prompt is 11 tokens; this server takes prompts of at most 10"):
        limits.check_prompt_tokens(11, "prompt")
    with pytest.raises(ValueError, match="max_n must be >= 1"):
        ServerLimits(max_n=0)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"temperature": 1e-300}, "temperature must be 0 (greedy) or at least 0.001"),
        ({"temperature": 101.0}, "less than or equal to 100"),
        ({"temperature": float("nan")}, "finite number"),
        ({"top_p": 1e-300}, "greater than or equal to 0.000001"),
        ({"top_p": float("inf")}, "finite number"),
        ({"seed": 2**64}, "less than or equal to 9223372036854775807"),
        ({"seed": -(2**63) - 1}, "greater than or equal to -9223372036854775808"),
    ],
)
def test_sampling_values_outside_the_float32_safe_ranges_are_refused(fields, message):
    with pytest.raises(pydantic.ValidationError, match=re.escape(message)):
        CompletionRequest(model="m", prompt="x", **fields)
    sampling = {("max_new_tokens" if k == "max_tokens" else k): v for k, v in fields.items()}
    with pytest.raises(pydantic.ValidationError):
        GenerateRequest(input_ids=[1], sampling_params=sampling)


def test_boundary_values_are_accepted():
    body = CompletionRequest(model="m", prompt="x", temperature=1e-3, top_p=1e-6, seed=-(2**63))
    assert (body.temperature, body.top_p, body.seed) == (1e-3, 1e-6, -(2**63))
    assert CompletionRequest(model="m", prompt="x", temperature=0, seed=2**63 - 1).temperature == 0


def test_null_content_is_refused_except_for_an_assistant_tool_call():
    with pytest.raises(pydantic.ValidationError, match="content is missing or null in a 'user' message"):
        ChatCompletionRequest(model="m", messages=[{"role": "user", "content": None}])
    with pytest.raises(pydantic.ValidationError, match="content is missing or null in a 'assistant' message"):
        ChatCompletionRequest(model="m", messages=[{"role": "assistant"}])
    call = {"role": "assistant", "content": None, "tool_calls": [{"id": "1", "type": "function"}]}
    assert ChatCompletionRequest(model="m", messages=[call]).messages[0].template_dict()["tool_calls"]
