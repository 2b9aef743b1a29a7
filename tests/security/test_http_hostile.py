"""Hostile HTTP input against ``hybridflow serve`` and ``hybridflow sandbox`` (issue 28: 3, 4, 5, 10a, 11).

A corpus of attacks: each test's docstring names the attack and the refusal expected. The apps run
in this process and are called with raw ASGI messages (no sockets) unless the test is about what a
process prints at start or how our own clients reach it; then it runs on a free port of 127.0.0.1.
Nothing here sends traffic anywhere but loopback.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from hybridflow.inference.generation_engine import GenerationEngine
from hybridflow.inference.weight_transfer import bucket_to_bytes
from hybridflow.models.tiny import build_tiny_model, build_tiny_tokenizer
from hybridflow.sandbox.isolation import RLIMITS, Isolation
from hybridflow.sandbox.limits import SandboxLimits
from hybridflow.server.app import build_app
from hybridflow.server.checks import ServerLimits
from hybridflow.server.state import ServerState
from hybridflow.server.text import TextCodec
from tests.serving import serve_in_thread

pytestmark = pytest.mark.usefixtures("one_torch_thread")

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT_S = 60
EVIL = "http://evil.example"
# Process-level isolation: a program that gets through really runs, so a test can see that it did.
WEAK = Isolation(RLIMITS, "process limits only (this test's choice)")


# ---- helpers -----------------------------------------------------------------------------------


async def _asgi(app: Any, method: str, path: str, body: bytes | list[bytes] = b"",
                headers: dict[str, str] | None = None) -> tuple[int, dict, dict[str, str]]:
    """One request through ``app``: (status, JSON body, response headers). ``body`` as a list is
    sent in chunks (``more_body``), as a chunked upload arrives. The client never disconnects."""
    chunks = body if isinstance(body, list) else [body]
    path_only, _, query = path.partition("?")
    all_headers = {"host": "127.0.0.1:8000", **(headers or {})}
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method,
             "scheme": "http", "path": path_only, "raw_path": path_only.encode(), "query_string": query.encode(),
             "root_path": "", "headers": [(k.lower().encode(), v.encode()) for k, v in all_headers.items()],
             "client": ("127.0.0.1", 40000), "server": ("127.0.0.1", 8000)}
    pending = [{"type": "http.request", "body": c, "more_body": i < len(chunks) - 1} for i, c in enumerate(chunks)]

    async def receive() -> dict:
        if pending:
            return pending.pop(0)
        await asyncio.Event().wait()  # the client stays connected
        return {"type": "http.disconnect"}

    sent: list[dict] = []

    async def send(message: dict) -> None:
        sent.append(message)

    await app(scope, receive, send)
    payload = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    start = sent[0]
    response_headers = {k.decode().lower(): v.decode() for k, v in start.get("headers", [])}
    return start["status"], json.loads(payload), response_headers


def call(app: Any, method: str, path: str, body: bytes | list[bytes] = b"",
         headers: dict[str, str] | None = None) -> tuple[int, dict, dict[str, str]]:
    return asyncio.run(_asgi(app, method, path, body, headers))


def post_json(app: Any, path: str, body: Any, headers: dict[str, str] | None = None) -> tuple[int, dict]:
    data = json.dumps(body).encode()
    status, reply, _ = call(app, "POST", path, data, {"content-type": "application/json",
                                                      "content-length": str(len(data)), **(headers or {})})
    return status, reply


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _http(method: str, url: str, body: bytes | None = None, headers: dict[str, str] | None = None) -> tuple[int, dict]:
    request = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


# ---- item 3: `hybridflow sandbox` ----------------------------------------------------------------


@pytest.fixture
def sandbox_app() -> Any:
    """The sandbox service as the library builds it (no token: the CLI adds one; see below)."""
    from hybridflow.sandbox.service import create_app

    return create_app(SandboxLimits(wall_s=5, memory_mb=512), WEAK, max_concurrent=1)


def _writes(marker: Path) -> bytes:
    """A /run_code body whose program leaves ``marker`` behind if it runs."""
    return json.dumps({"code": f"open({str(marker)!r}, 'w').write('ran')", "language": "python"}).encode()


def test_sandbox_refuses_a_text_plain_body_a_cross_site_form_can_send(sandbox_app, tmp_path):
    """Attack: a web page posts a form (``enctype="text/plain"``) whose body is JSON to
    ``http://127.0.0.1:8080/run_code``; browsers send that cross-site without asking, and the
    service parsed any body as JSON and ran the program. Refusal: 415, and nothing runs."""
    marker = tmp_path / "ran"
    for content_type in ("text/plain", "text/plain;charset=UTF-8", "application/x-www-form-urlencoded",
                         "multipart/form-data; boundary=x"):
        status, body, _ = call(sandbox_app, "POST", "/run_code", _writes(marker), {"content-type": content_type})
        assert status == 415, (content_type, body)
        assert body["error"]["code"] == "unsupported_media_type" and "application/json" in body["error"]["message"]
    assert not marker.exists()


def test_sandbox_refuses_a_body_without_a_content_type(sandbox_app, tmp_path):
    """Attack: ``fetch(url, {method: "POST", mode: "no-cors", body: new Blob([json])})`` sends the
    body with no Content-Type at all, which a JSON reader also takes. Refusal: 415, nothing runs."""
    marker = tmp_path / "ran"
    status, body, _ = call(sandbox_app, "POST", "/run_code", _writes(marker))
    assert status == 415 and "got none" in body["error"]["message"]
    assert not marker.exists()


def test_sandbox_refuses_a_request_from_a_foreign_page(sandbox_app, tmp_path):
    """Attack: a page at evil.example sends a JSON request (say, after a preflight some proxy
    answered). Refusal: its ``Origin`` is not a host the service answers to: 403, nothing runs;
    ``Origin: null`` (sandboxed frames, file: pages) likewise. A page served under the service's
    own host name passes."""
    marker = tmp_path / "ran"
    for origin in (EVIL, "http://127.0.0.1.evil.example:8080", "null"):
        status, body = post_json(sandbox_app, "/run_code", json.loads(_writes(marker)), {"origin": origin})
        assert status == 403 and body["error"]["code"] == "invalid_origin", origin
    assert not marker.exists()
    status, body = post_json(sandbox_app, "/run_code", {"code": "print(1)"}, {"origin": "http://localhost:3000"})
    assert status == 200 and body["run_result"]["stdout"] == "1\n"


def test_sandbox_refuses_a_rebound_host_name(sandbox_app, tmp_path):
    """Attack: DNS rebinding — evil.example re-pointed at 127.0.0.1, so the page's own origin
    reaches the service and the request says ``Host: evil.example:8080``. Refusal: 400
    ``invalid_host``, nothing runs."""
    marker = tmp_path / "ran"
    status, body = post_json(sandbox_app, "/run_code", json.loads(_writes(marker)), {"host": "evil.example:8080"})
    assert status == 400 and body["error"]["code"] == "invalid_host"
    assert not marker.exists()


def test_sandbox_caps_the_request_body(sandbox_app):
    """Attack: a 300 MB request body (the probe took the service to 1.6 GiB). Refusal: a
    ``Content-Length`` above the limit (16 MiB by default) is a 413 before a byte is read; a
    chunked body without a length is cut off with a 413 once it passes the limit."""
    status, body, _ = call(sandbox_app, "POST", "/run_code", b"{}",
                           {"content-type": "application/json", "content-length": str(300 * 1024 * 1024)})
    assert status == 413 and body["error"]["code"] == "body_too_large"
    nine_mib = b" " * (9 * 1024 * 1024)  # JSON whitespace: only the size is wrong
    status, body, _ = call(sandbox_app, "POST", "/run_code", [b'{"code": "print(1)"}', nine_mib, nine_mib],
                           {"content-type": "application/json"})
    assert status == 413 and body["error"]["code"] == "body_too_large"
    assert "limit of 16777216 bytes" in body["error"]["message"]


def test_sandbox_run_code_needs_the_token():
    """Attack: any local process (or a page that got past the checks above) calls /run_code.
    Refusal: with a token, a request without ``Authorization: Bearer TOKEN`` or with a wrong one
    is a 401 and runs nothing; /health stays open (it runs nothing)."""
    from hybridflow.sandbox.service import create_app

    app = create_app(SandboxLimits(wall_s=5, memory_mb=512), WEAK, max_concurrent=1, token="s3cret-token")
    for headers in ({}, {"authorization": "Bearer wrong"}, {"authorization": "s3cret-token"}):
        status, body = post_json(app, "/run_code", {"code": "print(1)"}, headers)
        assert status == 401 and body["error"]["code"] == "invalid_token", headers
    status, body = post_json(app, "/run_code", {"code": "print(1)"}, {"authorization": "Bearer s3cret-token"})
    assert status == 200 and body["status"] == "Success"
    assert call(app, "GET", "/health")[0] == 200


def test_sandbox_without_a_token_only_on_loopback(capsys):
    """Attack: the service started open (``--no-token``) on an address other machines reach.
    Refusal: exit status 2 with a message, before anything listens; on 0.0.0.0 without
    ``--token`` a token is generated, so the service is never open there."""
    from hybridflow.entrypoints.sandbox import main
    from hybridflow.sandbox.access import resolve_token

    assert main(["--host", "0.0.0.0", "--no-token", "--allow-weak-isolation", "--port", str(_free_port())]) == 2
    assert "--no-token is only allowed on a loopback --host" in capsys.readouterr().err
    token, generated = resolve_token("0.0.0.0", None, False)
    assert generated and len(token) >= 32
    assert resolve_token("127.0.0.1", None, True) == (None, False)
    assert resolve_token("::1", "given", False) == ("given", False)


def test_sandbox_deeply_nested_json_is_a_400(sandbox_app):
    """Attack: a body nested 100,000 lists deep; json's reader raises RecursionError, which the
    route did not expect (500 and a long traceback). Refusal: 400 that says why."""
    data = b"[" * 100_000 + b"]" * 100_000
    status, body, _ = call(sandbox_app, "POST", "/run_code", data, {"content-type": "application/json"})
    assert status == 400 and "too deeply" in body["message"]


def _start(cmd: list[str], env: dict[str, str], log: Path) -> subprocess.Popen:
    with log.open("w") as fh:
        return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=fh, stderr=subprocess.STDOUT)


def _wait_health(url: str, process: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + TIMEOUT_S  # a hang guard only
    while time.monotonic() < deadline:
        assert process.poll() is None, log.read_text()
        try:
            if _http("GET", url + "/health")[0] == 200:
                return
        except OSError:
            pass
        time.sleep(0.1)
    raise AssertionError(f"no answer from {url}: {log.read_text()}")


def _stop(process: subprocess.Popen) -> None:
    process.terminate()
    try:
        process.wait(15)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(5)


def test_hybridflow_sandbox_prints_a_generated_token_and_requires_it(tmp_path):
    """Attack: ``hybridflow sandbox`` started as documented (no flags about access), then called
    without credentials. Refusal: it generates a token, prints it at start, and /run_code
    answers 401 without it; with the printed token the program runs."""
    port, log = _free_port(), tmp_path / "sandbox.log"
    env = {k: v for k, v in os.environ.items() if k != "HYBRIDFLOW_SANDBOX_TOKEN"}
    process = _start([sys.executable, "-m", "hybridflow.entrypoints.sandbox", "--port", str(port), "--allow-weak-isolation",
                      "--timeout-s", "5", "--max-concurrent", "1"], env, log)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_health(url, process, log)
        found = re.search(r"sandbox token \(.*\): (\S+)$", log.read_text(), re.MULTILINE)
        assert found, log.read_text()
        body = json.dumps({"code": "print(2 + 3)"}).encode()
        status, reply = _http("POST", url + "/run_code", body, {"Content-Type": "application/json"})
        assert status == 401 and reply["error"]["code"] == "invalid_token"
        status, reply = _http("POST", url + "/run_code", body, {"Content-Type": "application/json",
                                                                "Authorization": f"Bearer {found.group(1)}"})
        assert status == 200 and reply["run_result"]["stdout"] == "5\n"
    finally:
        _stop(process)


def test_the_trainers_sandbox_child_and_its_client_use_the_token():
    """Our own client of the service: the trainer's ``LocalSandboxService`` hands its child a
    fresh token (in the environment, not the command line) and ``FusionSandbox`` sends it; a
    client without it is refused (401 → ``SandboxUnavailableError`` naming the status)."""
    from hybridflow.sandbox.client import FusionSandbox, SandboxUnavailableError
    from hybridflow.sandbox.local_service import LocalSandboxService

    service = LocalSandboxService(SandboxLimits(wall_s=5, memory_mb=512), max_concurrent=1, allow_weak_isolation=True)
    try:
        assert service.token and service.token not in " ".join(service._proc.args)
        result = asyncio.run(FusionSandbox(service.url, token=service.token, retries=0).run("print('hi')"))
        assert result.stdout == "hi\n" and result.return_code == 0
        with pytest.raises(SandboxUnavailableError, match="HTTP 401"):
            asyncio.run(FusionSandbox(service.url, token="wrong", retries=0).run("print('hi')"))
    finally:
        service.close()


# ---- item 4: `hybridflow serve --control-routes` ---------------------------------------------------


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return build_tiny_tokenizer()


@pytest.fixture
def control_app(tokenizer) -> Iterator[tuple[ServerState, Any]]:
    """A server with the control routes on, built as a library user would (no token given)."""
    engine = GenerationEngine(build_tiny_model(tokenizer, seed=0), tokenizer.pad_token_id, owns_weights=True)
    state = ServerState(engine=engine, codec=TextCodec(tokenizer), model_name="tiny", max_model_len=1024,
                        eos_token_ids=(tokenizer.eos_token_id,), control_routes=True)
    engine.start()
    yield state, build_app(state)
    engine.shutdown()


def test_a_cross_site_text_plain_post_cannot_abort_generation(control_app):
    """Attack: a page at evil.example posts ``text/plain`` to ``/abort_all`` (the probe closed
    admission this way). Refusal: 403 for the foreign Origin; admission stays open."""
    state, app = control_app
    status, body, _ = call(app, "POST", "/abort_all", b"{}",
                           {"content-type": "text/plain;charset=UTF-8", "origin": EVIL})
    assert status == 403 and body["error"]["code"] == "invalid_origin"
    assert state.engine.metrics()["paused"] is False


def test_a_text_plain_post_without_origin_cannot_abort_generation(control_app):
    """Attack: the same ``text/plain`` POST from a client that sends no Origin (an old browser,
    a form in a privacy mode). Refusal: 415; admission stays open."""
    state, app = control_app
    status, body, _ = call(app, "POST", "/abort_all", b"{}", {"content-type": "text/plain"})
    assert status == 415 and body["error"]["code"] == "unsupported_media_type"
    assert state.engine.metrics()["paused"] is False


def test_a_cross_site_weight_push_changes_no_weight(control_app):
    """Attack: a page posts a safetensors bucket that zeroes the final norm to ``/update_weights``
    (the probe's next greedy completion came back empty). Refusal: 403 (Origin), and 415 for a
    ``text/plain`` body without Origin; the served tensor and ``weight_version`` are unchanged."""
    state, app = control_app
    norm = state.engine.model.state_dict()["model.norm.weight"]
    before = norm.clone()
    bucket = bucket_to_bytes([("model.norm.weight", torch.zeros_like(norm))])
    path = "/update_weights?update_id=evil&bucket=0&final=1&version=7"
    for headers, status_wanted in (({"content-type": "text/plain", "origin": EVIL}, 403),
                                   ({"content-type": "application/octet-stream", "origin": EVIL}, 403),
                                   ({"content-type": "text/plain"}, 415)):
        status, body, _ = call(app, "POST", path, bucket, headers)
        assert status == status_wanted, (headers, body)
    assert torch.equal(state.engine.model.state_dict()["model.norm.weight"], before)
    assert state.engine.weight_version == 0


@pytest.fixture
def serve_args(tiny_model_dir) -> list[str]:
    return ["--model", str(tiny_model_dir), "--dtype", "fp32", "--max-batch-rows", "8"]


def test_control_routes_without_a_key_get_a_generated_token(serve_args):
    """Attack: ``hybridflow serve --control-routes`` started without a key, then any local
    process (or page) calls the controls. Refusal: a token is generated; a control route
    without it is a 401 and does nothing, with it the route works. The OpenAI routes stay open."""
    from hybridflow.entrypoints.serve import build_state, parse_args

    args = parse_args([*serve_args, "--control-routes"])
    assert args.control_token_generated and len(args.control_token) >= 32
    state = build_state(args)
    state.engine.start()
    try:
        app = build_app(state)
        for headers in ({}, {"authorization": "Bearer wrong"}):
            status, body = post_json(app, "/abort_all", {}, headers)
            assert status == 401 and body["error"]["code"] == "invalid_token", headers
            assert "control token" in body["error"]["message"]
        assert state.engine.metrics()["paused"] is False
        status, body = post_json(app, "/abort_all", {}, {"authorization": f"Bearer {args.control_token}"})
        assert status == 200 and state.engine.metrics()["paused"] is True
        assert post_json(app, "/resume_generation", {}, {"authorization": f"Bearer {args.control_token}"})[0] == 200
        status, body = post_json(app, "/generate", {"input_ids": [5, 6], "sampling_params": {"max_new_tokens": 2}})
        assert status == 200 and len(body["outputs"][0]["output_ids"]) >= 1
    finally:
        state.engine.shutdown()


def test_serve_prints_the_generated_token_and_our_http_client_uses_it(serve_args, monkeypatch, capsys):
    """The token is printed at start, and it is what the running app asks for: ``HttpClient``
    (the trainer's rollout/weight-sync client, ``engine_kwargs.api_key``) drives the controls
    with it, and is refused without it. The app runs in this process (uvicorn.run is replaced)."""
    import uvicorn

    import hybridflow.entrypoints.serve as serve_main
    from hybridflow.inference.client import HttpClient, InferenceRequestError

    apps: list[Any] = []
    monkeypatch.setattr(uvicorn, "run", lambda app, **kwargs: apps.append(app))
    monkeypatch.setattr(serve_main, "keep_freed_memory", lambda: None)
    for name in ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "LRU_CACHE_CAPACITY", "HF_HUB_OFFLINE"):
        monkeypatch.setenv(name, os.environ.get(name, "1024" if "CAPACITY" in name else "1"))
    monkeypatch.delenv("HYBRIDFLOW_CONTROL_TOKEN", raising=False)
    monkeypatch.delenv("HYBRIDFLOW_API_KEY", raising=False)
    assert serve_main.main([*serve_args, "--control-routes", "--port", str(_free_port())]) == 0
    found = re.search(r"control token \(.*\): (\S+)$", capsys.readouterr().out, re.MULTILINE)
    assert found and len(apps) == 1
    token = found.group(1)
    with serve_in_thread(apps[0]) as url:  # its lifespan starts the engine
        async def drive() -> tuple[int, int]:
            client = HttpClient(url, api_key=token)
            try:
                aborted = await client.abort_all()
                await client.resume_generation()
                return aborted, await client.get_weight_version()
            finally:
                client.close()

        assert asyncio.run(drive()) == (0, 0)

        async def without_token() -> None:
            client = HttpClient(url)
            try:
                await client.abort_all()
            finally:
                client.close()

        with pytest.raises(InferenceRequestError, match="answered 401"):
            asyncio.run(without_token())


def test_serve_on_a_non_loopback_address_needs_a_key(capsys):
    """Attack: ``hybridflow serve --host 0.0.0.0 [--control-routes]`` without a key, reachable
    by every machine on the network. Refusal: the arguments are refused (exit 2) with a message;
    ``--no-control-token`` is refused off loopback too. On loopback it is accepted."""
    from hybridflow.entrypoints.serve import parse_args

    for argv, message in ((["--host", "0.0.0.0"], "reachable from other machines"),
                          (["--host", "0.0.0.0", "--control-routes"], "give --api-key"),
                          (["--host", "0.0.0.0", "--api-key", "k", "--control-routes", "--no-control-token"],
                           "only allowed on a loopback --host")):
        with pytest.raises(SystemExit) as info:
            parse_args(["--model", "tiny-llama", *argv])
        assert info.value.code == 2 and message in capsys.readouterr().err, argv
    args = parse_args(["--model", "tiny-llama", "--control-routes", "--no-control-token"])
    assert args.control_token is None
    args = parse_args(["--model", "tiny-llama", "--host", "0.0.0.0", "--api-key", "k", "--control-routes"])
    assert args.control_token == "k" and not args.control_token_generated


# ---- item 5: one request must not monopolise `serve` ------------------------------------------------


def test_a_small_request_is_not_stuck_behind_a_big_one(serve_args, monkeypatch):
    """Attack: one call with many prompts × n × long replies fills every row, and a small
    request sent after it waited for all of it (the probe: 102 s). Refusal: rows are shared
    between calls — with 8 rows, a call holds at most 4 while others wait — so the small request
    is admitted at the next step and finishes after exactly 1 + max_tokens forwards, while no
    request of the big call has finished. Counted in forwards, not seconds."""
    from hybridflow.entrypoints.serve import build_state, parse_args

    state = build_state(parse_args(serve_args))  # --max-batch-rows 8
    engine = state.engine
    app = build_app(state)
    reached, release, submitted = threading.Event(), threading.Event(), threading.Event()
    real_decode, real_submit, decodes = engine.decoder.decode, engine.submit, []
    big_futures: list[Any] = []
    small_done: dict[str, Any] = {}
    small_prompt = (9, 9, 9)

    def decode(tokens, positions):  # hold the engine inside its 3rd decode step until released
        decodes.append(1)
        if len(decodes) == 3:
            reached.set()
            assert release.wait(TIMEOUT_S)
        return real_decode(tokens, positions)

    def submit(request, prompt_logprobs=None):
        future = real_submit(request, prompt_logprobs)
        if request.prompt_ids == small_prompt:
            def done(_):  # on the engine thread, at the step that finished the request
                small_done["forwards"] = engine.batcher.stats.forwards
                small_done["big_done"] = [f.done() for f in big_futures]

            future.add_done_callback(done)
            submitted.set()
        else:
            big_futures.append(future)
        return future

    monkeypatch.setattr(engine.decoder, "decode", decode)
    monkeypatch.setattr(engine, "submit", submit)
    big = {"input_ids": [[5, 6, 7], [8, 9], [10, 11, 12], [13]],
           "sampling_params": {"max_new_tokens": 40, "n": 4, "temperature": 0, "ignore_eos": True}}
    small = {"input_ids": list(small_prompt),
             "sampling_params": {"max_new_tokens": 4, "temperature": 0, "ignore_eos": True}}

    async def scenario() -> tuple[tuple[int, dict], tuple[int, dict], int]:
        big_call = asyncio.create_task(asyncio.to_thread(post_json, app, "/generate", big))
        assert await asyncio.to_thread(reached.wait, TIMEOUT_S)
        held = engine.batcher.stats.forwards  # the engine is blocked: prefill + 2 decodes counted
        small_call = asyncio.create_task(asyncio.to_thread(post_json, app, "/generate", small))
        assert await asyncio.to_thread(submitted.wait, TIMEOUT_S)
        release.set()
        return await small_call, await big_call, held

    engine.start()
    try:
        (small_status, small_body), (big_status, big_body), held = asyncio.run(scenario())
    finally:
        release.set()
        engine.shutdown()
    assert small_status == 200 and len(small_body["outputs"][0]["output_ids"]) == 4
    assert small_done["big_done"] == [False] * 4  # no request of the big call had finished
    assert small_done["forwards"] - held == 1 + 4  # the held decode, then a join prefill + 3 decodes
    assert big_status == 200 and [len(o["output_ids"]) for o in big_body["outputs"]] == [40] * 16


@pytest.fixture
def app_with(tokenizer) -> Iterator[Any]:
    """``app_with(limits)``: a served tiny model with those per-request limits."""
    engines: list[GenerationEngine] = []

    def build(limits: ServerLimits) -> Any:
        engine = GenerationEngine(build_tiny_model(tokenizer, seed=0), tokenizer.pad_token_id)
        engines.append(engine)
        state = ServerState(engine=engine, codec=TextCodec(tokenizer), model_name="tiny", max_model_len=1024,
                            eos_token_ids=(tokenizer.eos_token_id,), limits=limits)
        engine.start()
        return build_app(state)

    yield build
    for engine in engines:
        engine.shutdown()


def test_a_request_above_the_token_budget_is_a_429(app_with):
    """Attack: the probe's request, 64 prompts × n = 16 × 1,000 tokens (105 s of the server).
    Refusal: prompts × n × max_tokens above the per-request budget (65,536 by default) is a 429
    with OpenAI's error body and ``x-should-retry: false``, before anything is generated."""
    assert ServerLimits().max_request_tokens < 64 * 16 * 1000  # else this request would run for minutes
    app = app_with(ServerLimits())
    data = json.dumps({"model": "tiny", "prompt": ["x"] * 64, "n": 16, "max_tokens": 1000}).encode()
    status, body, headers = call(app, "POST", "/v1/completions", data, {"content-type": "application/json"})
    assert status == 429 and headers["x-should-retry"] == "false"
    error = body["error"]
    assert error["type"] == "tokens" and error["code"] == "rate_limit_exceeded" and error["param"] == "max_tokens"
    assert "1024000 generated tokens" in error["message"] and "at most 65536" in error["message"]


def test_the_token_budget_counts_every_route(app_with):
    """Attack: the same budget reached through chat (n × max_tokens) and /generate (prompts × n ×
    max_new_tokens). Refusal: 429 on each; a request inside the budget is served."""
    app = app_with(ServerLimits(max_request_tokens=100))
    chat = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "n": 2, "max_tokens": 51}
    assert post_json(app, "/v1/chat/completions", chat)[0] == 429
    generate = {"input_ids": [[5, 6], [7, 8]], "sampling_params": {"max_new_tokens": 51}}
    status, body = post_json(app, "/generate", generate)
    assert status == 429 and body["error"]["param"] == "sampling_params.max_new_tokens"
    generate["sampling_params"]["max_new_tokens"] = 50
    assert post_json(app, "/generate", generate)[0] == 200


# ---- item 10a: no raw tracebacks ---------------------------------------------------------------------


def _nested(depth: int) -> dict:
    value: dict = {}
    for _ in range(depth):
        value = {"a": value}
    return value


def test_deeply_nested_chat_template_kwargs_is_a_400_without_a_traceback(app_with, caplog):
    """Attack: ``chat_template_kwargs`` nested 900 deep (HTTP 500 and ~3,000 log lines per
    request). Refusal: 400 naming the depth limit, and nothing logged at error level."""
    app = app_with(ServerLimits())
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2,
            "chat_template_kwargs": _nested(900)}
    with caplog.at_level(logging.INFO):
        status, reply = post_json(app, "/v1/chat/completions", body)
    assert status == 400 and reply["error"]["type"] == "invalid_request_error"
    assert "more than 64 levels deep" in reply["error"]["message"]
    assert [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info] == []


def test_a_body_too_deep_for_the_json_reader_is_a_400_in_the_error_format(app_with, caplog):
    """Attack: a body nested 100,000 deep, past the JSON reader's own recursion limit. Refusal:
    400 in OpenAI's error body (not the framework's ``{"detail": ...}``), nothing logged."""
    app = app_with(ServerLimits())
    data = b'{"model": "tiny", "prompt": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    with caplog.at_level(logging.INFO):
        status, body, _ = call(app, "POST", "/v1/completions", data, {"content-type": "application/json"})
    assert status == 400 and body["error"]["type"] == "invalid_request_error" and body["error"]["message"]
    assert [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info] == []


# ---- item 11: the memory the docs promise ------------------------------------------------------------


def test_the_memory_section_states_a_measurement_on_the_avx2_kind():
    """Attack (on the docs): docs/server.md promised a resident set measured only on an
    ``avx512_bf16`` machine (bf16); on the AVX2-only kind (dtype auto = fp32) the probe saw
    ~1 GiB. Expected: the Memory section states the steady RSS measured on the AVX2-only kind,
    for SmolLM2-135M-Instruct in fp32 at 16 clients, with the number in MiB."""
    text = (ROOT / "docs" / "server.md").read_text()
    memory = text.split("## Memory", 1)[1].split("\n## ", 1)[0]
    found = re.search(r"AVX2-only[^\n]*\n?[^\n]*fp32", memory)
    assert found, "no measurement on the AVX2-only kind (fp32) in docs/server.md's Memory section"
    steady = re.search(r"SmolLM2-135M[^|\n]*\|[^\n]*AVX2[^\n]*\| *([\d,]+) MiB", memory)
    assert steady and 500 <= int(steady.group(1).replace(",", "")) <= 4000, memory
