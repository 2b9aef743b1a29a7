"""The FastAPI app in this process, called through raw ASGI messages (no sockets): a broken model
answers each request with a clear 500, and a client that disconnects has its generation cancelled.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator

import pytest
import torch

from hybridflow.inference.generation_engine import GenerationEngine
from hybridflow.models.tiny import build_tiny_model, build_tiny_tokenizer
from hybridflow.server.app import build_app
from hybridflow.server.state import ServerState
from hybridflow.server.text import TextCodec

pytestmark = pytest.mark.usefixtures("one_torch_thread")
TIMEOUT_S = 60


async def asgi_post(app, path: str, body: dict, disconnect: asyncio.Event | None = None) -> tuple[int, dict]:
    """POST ``body`` to ``app``; after the body, the client "disconnects" once ``disconnect`` is set."""
    data = json.dumps(body).encode()
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
             "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "",
             "headers": [(b"host", b"127.0.0.1:8000"), (b"content-type", b"application/json"),
                         (b"content-length", str(len(data)).encode())],
             "client": ("127.0.0.1", 40000), "server": ("127.0.0.1", 8000)}
    body_sent = False

    async def receive():
        nonlocal body_sent
        if not body_sent:
            body_sent = True
            return {"type": "http.request", "body": data, "more_body": False}
        await (disconnect or asyncio.Event()).wait()
        return {"type": "http.disconnect"}

    sent: list[dict] = []

    async def send(message):
        sent.append(message)

    await app(scope, receive, send)
    payload = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return sent[0]["status"], json.loads(payload)


def _state(model, tokenizer) -> ServerState:
    engine = GenerationEngine(model, tokenizer.pad_token_id)
    return ServerState(engine=engine, codec=TextCodec(tokenizer), model_name="tiny", max_model_len=1024,
                       eos_token_ids=(tokenizer.eos_token_id,))


@pytest.fixture
def served() -> Iterator[tuple[ServerState, object]]:
    tokenizer = build_tiny_tokenizer()
    state = _state(build_tiny_model(tokenizer, seed=0), tokenizer)
    state.engine.start()  # the app's lifespan would; raw ASGI calls do not run it
    yield state, build_app(state)
    state.engine.shutdown()


def test_a_model_with_nan_weights_gets_a_500_that_names_the_problem():
    tokenizer = build_tiny_tokenizer()
    model = build_tiny_model(tokenizer, seed=0)
    with torch.no_grad():
        for p in model.parameters():
            p.fill_(float("nan"))
    state = _state(model, tokenizer)
    state.engine.start()
    try:
        app = build_app(state)
        for sampling in ({"temperature": 0}, {"temperature": 1.0, "top_p": 0.9}):
            status, body = asyncio.run(asgi_post(app, "/generate", {"input_ids": [5, 6], "sampling_params": sampling}))
            assert status == 500 and body["error"]["type"] == "server_error"
            assert "non-finite logits" in body["error"]["message"] and "the model is broken" in body["error"]["message"]
        assert state.engine.metrics()["engine_alive"]
    finally:
        state.engine.shutdown()


def test_a_client_that_disconnects_has_its_generation_cancelled(served, monkeypatch):
    state, app = served
    engine = state.engine
    reached, release, cancelled = threading.Event(), threading.Event(), threading.Event()
    real_decode, real_cancel, calls = engine.decoder.decode, engine.cancel, []

    def decode(tokens, positions):  # hold the engine inside its 3rd decode step until released
        calls.append(1)
        if len(calls) == 3:
            reached.set()
            release.wait(TIMEOUT_S)
        return real_decode(tokens, positions)

    def cancel(future):
        real_cancel(future)
        cancelled.set()

    monkeypatch.setattr(engine.decoder, "decode", decode)
    monkeypatch.setattr(engine, "cancel", cancel)

    async def scenario() -> tuple[int, dict]:
        gone = asyncio.Event()
        call = asyncio.create_task(asgi_post(app, "/generate", {
            "input_ids": [5, 6], "sampling_params": {"max_new_tokens": 500, "temperature": 0, "ignore_eos": True}},
            disconnect=gone))
        assert await asyncio.to_thread(reached.wait, TIMEOUT_S)
        gone.set()
        assert await asyncio.to_thread(cancelled.wait, TIMEOUT_S)
        release.set()
        return await call

    status, body = asyncio.run(scenario())
    assert status == 499 and "cancelled" in body["error"]["message"]
    # The inbox is first in, first out: once a later request is answered, the cancel was applied.
    follow_up = asyncio.run(asgi_post(app, "/generate", {"input_ids": [5, 6], "sampling_params": {
        "max_new_tokens": 2, "temperature": 0}}))
    assert follow_up[0] == 200
    metrics = engine.metrics()
    # the prefill and 3 decode steps ran (4 tokens); the cancel took effect before the next step
    assert metrics["requests_cancelled"] == 1 and metrics["tokens_generated"] == 4 + 2
    assert metrics["running_requests"] == 0


def test_weight_updates_are_off_without_a_weights_root(served):
    state, app = served
    status, body = asyncio.run(asgi_post(app, "/update_weights_from_disk", {"model_path": "/tmp"}))
    assert status == 403 and "--weights-root" in body["error"]["message"]
    assert state.engine.metrics()["weight_version"] == 0
