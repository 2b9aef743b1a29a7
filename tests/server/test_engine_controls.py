"""The built-in engine's controls beyond the shared contract (tests/inference/test_server_contract.py):
what sleep level 2 really frees, what it refuses, a request with several responses under
abort_all, and the HTTP face's guards (routes off by default, buckets in order, score-only
requests need prompt_logprobs)."""

from __future__ import annotations

import asyncio
import json

import pytest
import torch

from hybridflow.inference.batcher_types import GenRequest
from hybridflow.inference.client import InProcessClient
from hybridflow.inference.engine_queue import RequestRefused
from hybridflow.inference.generation_engine import GenerationEngine
from hybridflow.inference.protocol import SamplingParams
from hybridflow.inference.sampling import GenerationParams
from hybridflow.inference.weight_transfer import bucket_to_bytes
from hybridflow.inference.weights import WeightsRejected
from hybridflow.models.tiny import build_tiny_model, build_tiny_tokenizer
from hybridflow.server.app import build_app
from hybridflow.server.state import ServerState
from hybridflow.server.text import TextCodec

from .test_app import asgi_post

pytestmark = pytest.mark.usefixtures("one_torch_thread")
TIMEOUT_S = 60
GREEDY = SamplingParams(temperature=0.0)


@pytest.fixture(scope="module")
def tokenizer():
    return build_tiny_tokenizer()


def _engine(tokenizer, owns: bool = True) -> GenerationEngine:
    engine = GenerationEngine(build_tiny_model(tokenizer, seed=0), tokenizer.pad_token_id, owns_weights=owns)
    engine.start()
    return engine


def test_sleep_level_two_frees_the_parameters_until_weights_are_pushed(tokenizer):
    engine = _engine(tokenizer)
    client = InProcessClient(engine)
    weights = {k: v.clone() for k, v in engine.model.state_dict().items()}
    try:
        before = asyncio.run(client.generate("a", [5, 6, 7], GREEDY, 8))
        engine.sleep(2).result(TIMEOUT_S)
        assert all(p.numel() == 0 for p in engine.model.parameters())
        with pytest.raises(WeightsRejected, match="wake_up"):
            engine.update_weights_from_tensors(weights.items(), version=1)
        engine.wake_up(["weights", "kv_cache"]).result(TIMEOUT_S)
        assert [tuple(p.shape) for p in engine.model.parameters()] != [(0,)] * len(list(engine.model.parameters()))
        with pytest.raises(RequestRefused, match="freed by sleep"):  # awake, but the weights are garbage
            asyncio.run(client.generate("b", [5, 6, 7], GREEDY, 8))
        partial = [(k, v) for k, v in weights.items() if "layers.0." in k]
        with pytest.raises(WeightsRejected, match="every parameter must be sent"):
            engine.update_weights_from_tensors(partial, version=1)
        engine.update_weights_from_tensors(weights.items(), version=1).result(TIMEOUT_S)
        after = asyncio.run(client.generate("c", [5, 6, 7], GREEDY, 8))
        assert after.token_ids == before.token_ids and after.weight_version == 1
    finally:
        engine.shutdown()


def test_level_two_is_refused_for_a_borrowed_module(tokenizer):
    engine = _engine(tokenizer, owns=False)
    try:
        with pytest.raises(ValueError, match="owns_weights=False"):
            engine.sleep(2)
        assert engine.sleep(1).result(TIMEOUT_S) == 1
    finally:
        engine.shutdown()


def test_abort_all_hands_back_every_response_of_a_request(tokenizer):
    engine = _engine(tokenizer)
    try:
        params = GenerationParams(max_new_tokens=600, temperature=1.0, do_sample=True, n=3)
        future = engine.submit(GenRequest((5, 6, 7), params, seed=1))
        while engine.batcher.stats.tokens_generated < 9:
            pass
        assert engine.abort_all().result(TIMEOUT_S) == 1
        outputs = future.result(TIMEOUT_S)
        assert len(outputs) == 3 and all(o.finish_reason == "abort" and 0 < len(o.token_ids) < 600 for o in outputs)
        assert engine.metrics()["paused"] and engine.batcher.stats.requests_aborted == 1
        engine.resume_generation().result(TIMEOUT_S)
        assert not engine.metrics()["paused"]
    finally:
        engine.shutdown()


async def _asgi(app, method: str, path: str, body: bytes, content_type: bytes) -> tuple[int, dict]:
    path_only, _, query = path.partition("?")
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method,
             "scheme": "http", "path": path_only, "raw_path": path_only.encode(), "query_string": query.encode(),
             "root_path": "", "headers": [(b"host", b"127.0.0.1:8000"), (b"content-type", content_type),
                                          (b"content-length", str(len(body)).encode())],
             "client": ("127.0.0.1", 40000), "server": ("127.0.0.1", 8000)}
    sent_body = False

    async def receive():
        nonlocal sent_body
        if not sent_body:
            sent_body = True
            return {"type": "http.request", "body": body, "more_body": False}
        await asyncio.Event().wait()

    sent: list[dict] = []

    async def send(message):
        sent.append(message)

    await app(scope, receive, send)
    return sent[0]["status"], json.loads(b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body"))


@pytest.fixture
def app_state(tokenizer, request):
    engine = GenerationEngine(build_tiny_model(tokenizer, seed=0), tokenizer.pad_token_id, owns_weights=True)
    state = ServerState(engine=engine, codec=TextCodec(tokenizer), model_name="tiny", max_model_len=1024,
                        eos_token_ids=(tokenizer.eos_token_id,), control_routes=getattr(request, "param", True))
    engine.start()
    yield state, build_app(state)
    engine.shutdown()


@pytest.mark.parametrize("app_state", [False], indirect=True)
def test_control_routes_are_off_unless_asked_for(app_state):
    _, app = app_state
    for path in ("/abort_all", "/resume_generation", "/sleep", "/wake_up", "/clear_kv_cache"):
        status, body = asyncio.run(asgi_post(app, path, {}))
        assert status == 403 and "--control-routes" in body["error"]["message"], path
    status, body = asyncio.run(_asgi(app, "POST", "/update_weights?update_id=a&bucket=0&final=1&version=1", b"x",
                                     b"application/octet-stream"))
    assert status == 403


def test_buckets_out_of_order_drop_the_update(app_state, tokenizer):
    state, app = app_state
    before = {k: v.clone() for k, v in state.engine.model.state_dict().items()}
    other = list(build_tiny_model(tokenizer, seed=1).state_dict().items())
    first, second = bucket_to_bytes(other[:3]), bucket_to_bytes(other[3:6])
    octet = b"application/octet-stream"

    async def go():
        ok = await _asgi(app, "POST", "/update_weights?update_id=u&bucket=0&final=0&version=5", first, octet)
        skipped = await _asgi(app, "POST", "/update_weights?update_id=u&bucket=2&final=1&version=5", second, octet)
        late = await _asgi(app, "POST", "/update_weights?update_id=u&bucket=1&final=1&version=5", second, octet)
        garbage = await _asgi(app, "POST", "/update_weights?update_id=v&bucket=0&final=1&version=5", b"not", octet)
        return ok, skipped, late, garbage

    ok, skipped, late, garbage = asyncio.run(go())
    assert ok[0] == 200 and ok[1]["staged_tensors"] == 3
    assert skipped[0] == 400 and "expected bucket 1" in skipped[1]["error"]["message"]
    assert late[0] == 400 and "bucket 0 of a new update" in late[1]["error"]["message"]  # the update was dropped
    assert garbage[0] == 400 and "safetensors" in garbage[1]["error"]["message"]
    assert state.engine.weight_version == 0
    assert all(torch.equal(v, before[k]) for k, v in state.engine.model.state_dict().items())


def test_score_only_requests_need_prompt_logprobs(app_state):
    _, app = app_state
    status, body = asyncio.run(asgi_post(app, "/generate", {"input_ids": [5, 6, 7], "sampling_params": {"max_new_tokens": 0}}))
    assert status == 400 and "prompt_logprobs" in body["error"]["message"]
    status, body = asyncio.run(asgi_post(app, "/generate", {"input_ids": [5, 6, 7], "prompt_logprobs": 1,
                                                            "sampling_params": {"max_new_tokens": 0}}))
    assert status == 200 and len(body["outputs"][0]["prompt_logprobs"]) == 2 and body["outputs"][0]["output_ids"] == []
