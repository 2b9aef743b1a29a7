"""One bad request hurts no one: the real ``hybridflow serve`` process under malformed and extreme
requests sent concurrently with well-formed ones, a client that hangs up, foreign Host headers,
missing keys, bad weight folders, and SIGTERM while a request runs.
"""

from __future__ import annotations

import json
import random
import signal
import socket
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from safetensors.torch import load_file, save_file

from hybridflow.models.tiny import build_tiny_tokenizer, save_tiny_model

MODEL = "tiny-llama"
NAN = float("nan")
INF = float("inf")

# (field, value, valid?) — values at and beyond the edges of every sampling parameter.
COMPLETION_MUTATIONS: list[tuple[str, Any, bool]] = [
    *[("temperature", v, True) for v in (0, 1e-3, 0.5, 2.0, 100.0)],
    *[("temperature", v, False) for v in (1e-300, 1e-30, 5e-4, -1, 101, 1e300, NAN, INF, "hot", True)],
    *[("top_p", v, True) for v in (1e-6, 0.5, 1.0)],
    *[("top_p", v, False) for v in (1e-300, 0, 1.5, NAN, -INF)],
    *[("top_k", v, True) for v in (-1, 0, 1, 40, 2**31 - 1)],
    *[("top_k", v, False) for v in (-2, 2**31, 10**30, 2.5)],
    *[("seed", v, True) for v in (-(2**63), -1, 0, 2**63 - 1)],
    *[("seed", v, False) for v in (2**64, -(2**63) - 1, 10**40, 1.5, "7")],
    *[("n", v, True) for v in (1, 16)],
    *[("n", v, False) for v in (0, 17, -3, 10**6)],
    *[("max_tokens", v, False) for v in (0, -1, 10**30)],
    *[("logprobs", v, True) for v in (0, 20)],
    *[("logprobs", v, False) for v in (21, -1)],
    *[("stop", v, True) for v in (["zz"], ["a" * 256])],
    *[("stop", v, False) for v in ([""], ["s"] * 17, ["a" * 257], [1], "a\x00")],
    *[("prompt", v, True) for v in ("ok", [5, 6, 7], ["a", "b"], [[5, 6], [7]])],
    *[("prompt", v, False) for v in ("a\x00b", "x\ud800", [], [-1], [10**9], [[5], []], [[5]] * 65, None)],
    ("model", "other-model", False),
    ("bogus_field", 1, False),
    ("stream_options", {"include_usage": True}, False),
]
CHAT_MUTATIONS: list[tuple[str, Any, bool]] = [
    ("messages", [{"role": "user", "content": None}], False),
    ("messages", [{"role": "user", "content": "a\x00b"}], False),
    ("messages", [{"role": "user", "content": "\udc00"}], False),
    ("messages", [{"role": "user", "content": [{"type": "text", "text": "\ud83d"}]}], False),
    ("messages", [], False),
    ("messages", [{"role": "", "content": "x"}], False),
    ("messages", [{"role": "user", "content": "Hi \u00e9 \U0001f600"}], True),
    *[m for m in COMPLETION_MUTATIONS if m[0] in ("temperature", "top_p", "seed", "n", "stop")],
]


def _mutated(rng: random.Random, base: dict, mutations: list[tuple[str, Any, bool]]) -> tuple[dict, bool]:
    """``base`` with 1-3 mutations; half the time only valid ones (extreme values that must work)."""
    if rng.random() < 0.5:
        mutations = [m for m in mutations if m[2]]
    body, valid = dict(base), True
    for field, value, ok in rng.sample(mutations, rng.randint(1, 3)):
        body[field] = value
        valid = valid and ok
    return body, valid


def fuzz_cases(seed: int, count: int) -> list[tuple[str, dict, bool]]:
    rng = random.Random(seed)
    cases = []
    for i in range(count):
        if i % 3 == 2:
            body, valid = _mutated(rng, {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}],
                                         "max_tokens": 4}, CHAT_MUTATIONS)
            cases.append(("/v1/chat/completions", body, valid))
        else:
            body, valid = _mutated(rng, {"model": MODEL, "prompt": "Hello", "max_tokens": 4}, COMPLETION_MUTATIONS)
            cases.append(("/v1/completions", body, valid))
    return cases


def _post_raw(server, path: str, body: dict) -> tuple[int, dict]:
    # json.dumps writes NaN / Infinity as the bare words Python's reader accepts, and lone
    # surrogates as \\udXXX escapes, which is what a hostile client can send.
    return server.request("POST", path, body)


def test_malformed_and_extreme_requests_never_hurt_well_formed_ones(server):
    cases = fuzz_cases(seed=20260301, count=60)
    assert 15 < sum(valid for _, _, valid in cases) < 45  # the mix really has both kinds
    good = [("/v1/completions", {"model": MODEL, "prompt": f"Request {i}", "max_tokens": 6, "temperature": t,
                                 "ignore_eos": True}) for i, t in enumerate([0, 1.0] * 6)]
    good += [("/generate", {"input_ids": [5, 6, 7], "sampling_params": {"max_new_tokens": 6, "n": 2,
                                                                        "ignore_eos": True, "seed": i}})
             for i in range(4)]
    jobs = [(path, body, "good") for path, body in good] + [(p, b, v) for p, b, v in cases]
    random.Random(7).shuffle(jobs)
    with ThreadPoolExecutor(max_workers=12) as pool:
        results = list(pool.map(lambda job: (job, _post_raw(server, job[0], job[1])), jobs))
    for (path, body, kind), (status, reply) in results:
        if kind == "good":
            assert status == 200, (body, reply)
            tokens = [len(o["output_ids"]) for o in reply["outputs"]] if path == "/generate" else None
            assert tokens in (None, [6, 6]) and reply["usage"]["completion_tokens"] == (12 if tokens else 6)
        elif kind:  # extreme but valid
            assert status == 200, (body, reply)
        else:
            assert status == 400, (body, status, reply)
            assert reply["error"]["type"] == "invalid_request_error" and reply["error"]["message"]
    status, health = server.request("GET", "/health")
    assert status == 200 and health["engine_alive"] and health["running_requests"] == 0


@pytest.mark.parametrize(
    ("message", "problem"),
    [
        ({"role": "user", "content": None}, "content is missing or null in a 'user' message"),
        ({"role": "user", "content": "a\x00b"}, "messages.0.content contains a NUL character"),
        ({"role": "user", "content": "a\ud800b"}, "messages.0.content contains a lone UTF-16 surrogate (U+D800)"),
    ],
)
def test_bad_message_text_is_a_400_that_names_the_problem(server, message, problem):
    status, body = server.request("POST", "/v1/chat/completions", {"model": MODEL, "messages": [message]})
    assert status == 400 and problem in body["error"]["message"]
    assert "dict object" not in body["error"]["message"] and "TextEncodeInput" not in body["error"]["message"]


def test_foreign_host_and_missing_key_are_refused(server):
    body = {"model": MODEL, "prompt": "x", "max_tokens": 1}
    status, reply = server.request("POST", "/v1/completions", body, headers={
        "Content-Type": "application/json", "Authorization": f"Bearer {server.api_key}", "Host": "evil.example"})
    assert status == 400 and reply["error"]["code"] == "invalid_host"
    for auth in ({}, {"Authorization": "Bearer nope"}):
        status, reply = server.request("POST", "/v1/completions", body,
                                       headers={"Content-Type": "application/json", **auth})
        assert status == 401 and reply["error"]["code"] == "invalid_api_key"
    status, reply = server.request("POST", "/v1/completions", body, headers={
        "Content-Type": "application/json", "Authorization": f"Bearer {server.api_key}", "Host": "localhost:1"})
    assert status == 200


def test_weight_folders_with_nan_or_outside_the_root_are_refused(server, tmp_path):
    request = {"input_ids": [5, 6, 7], "sampling_params": {"max_new_tokens": 6, "temperature": 0}}
    before = server.request("POST", "/generate", request)[1]["outputs"][0]["output_ids"]
    folder = save_tiny_model(server.weights_root / "nan", build_tiny_tokenizer(), seed=3)
    weights = load_file(str(folder / "model.safetensors"))
    weights["model.embed_tokens.weight"][5, 0] = NAN
    save_file(weights, str(folder / "model.safetensors"))
    status, reply = server.request("POST", "/update_weights_from_disk", {"model_path": "nan"})
    assert status == 400 and "not finite" in reply["error"]["message"]
    outside = save_tiny_model(tmp_path / "outside", build_tiny_tokenizer(), seed=3)
    generic = set()
    for given in (str(outside), "../" + outside.name, "/etc", "no_such_folder"):
        status, reply = server.request("POST", "/update_weights_from_disk", {"model_path": given})
        assert status == 400
        generic.add(reply["error"]["message"].replace(repr(given), "PATH"))
    assert len(generic) == 1  # the same words whether or not the path exists
    assert server.request("POST", "/generate", request)[1]["outputs"][0]["output_ids"] == before
    assert server.request("GET", "/metrics")[1]["weight_version"] == 0


def _metrics(server) -> dict:
    return server.request("GET", "/metrics")[1]


def _wait_for(server, condition, polls: int = 3000) -> dict:
    """Poll /metrics until ``condition(metrics)``; returns the last metrics either way."""
    for _ in range(polls):
        metrics = _metrics(server)
        if condition(metrics):
            break
        threading.Event().wait(0.01)
    return metrics


def test_a_client_that_hangs_up_has_its_generation_cancelled(server):
    before = _metrics(server)
    body = json.dumps({"input_ids": [5, 6, 7], "sampling_params": {
        "max_new_tokens": 1000, "n": 16, "temperature": 1.0, "ignore_eos": True}}).encode()
    host, port = server.base_url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)))
    sock.sendall(b"POST /generate HTTP/1.1\r\nHost: " + host.encode() + b"\r\nContent-Type: application/json\r\n"
                 + f"Authorization: Bearer {server.api_key}\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)
    # 16 rows × 1000 tokens take seconds; hang up as soon as the engine runs it
    assert _wait_for(server, lambda m: m["running_requests"] == 1)["running_requests"] == 1
    sock.close()
    after = _wait_for(server, lambda m: m["running_requests"] == 0)
    assert after["requests_cancelled"] - before["requests_cancelled"] == 1
    assert after["requests_finished"] == before["requests_finished"]
    assert after["tokens_generated"] - before["tokens_generated"] < 16 * 1000


def test_sigterm_stops_the_server_while_a_request_runs(server):
    """Last in the module: it stops the module's server."""
    body = {"input_ids": [5, 6], "sampling_params": {"max_new_tokens": 1000, "n": 16, "ignore_eos": True}}

    def call() -> None:
        try:
            server.request("POST", "/generate", body)
        except OSError:  # the connection closes under it: expected
            pass

    thread = threading.Thread(target=call)
    thread.start()
    assert _wait_for(server, lambda m: m["running_requests"] == 1)["running_requests"] == 1
    server.process.send_signal(signal.SIGTERM)
    # The old server, its engine thread dead, ignored SIGTERM while requests hung. uvicorn
    # exits 0 or re-raises the signal (-15), depending on its version.
    assert server.process.wait(timeout=60) in (0, -signal.SIGTERM)
    thread.join(timeout=60)
    assert not thread.is_alive()
