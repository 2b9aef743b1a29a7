"""``hybridflow sandbox`` speaks Sandbox Fusion's /run_code; the clients; the isolation policy."""

from __future__ import annotations

import asyncio
import base64
import json
import socket
import threading
import time
import urllib.request

import pytest

from hybridflow.sandbox import isolation as isolation_module
from hybridflow.sandbox.client import (
    FusionSandbox,
    LocalSandbox,
    SandboxUnavailableError,
)
from hybridflow.sandbox.executor import FINISHED, TIME_LIMIT, RunResult, run_code
from hybridflow.sandbox.fusion import (
    FusionRequest,
    FusionRequestError,
    fusion_response,
    result_from_fusion,
)
from hybridflow.sandbox.isolation import (
    RLIMITS,
    Isolation,
    IsolationError,
    detect_isolation,
    require_isolation,
)
from hybridflow.sandbox.limits import SandboxLimits

WEAK = Isolation(RLIMITS, "bubblewrap is not installed (test)")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def service():
    """The app under uvicorn in a thread: its /run_code URL; 2 programs at once, 3 s cap."""
    uvicorn = pytest.importorskip("uvicorn")
    from hybridflow.sandbox.service import create_app

    limits = SandboxLimits(wall_s=3, memory_mb=512, max_output_bytes=2048)
    port = _free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(limits, detect_isolation(), max_concurrent=2),
                                           host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline
        time.sleep(0.02)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(30)


def post(url: str, body: dict) -> tuple[int, dict]:
    request = urllib.request.Request(url + "/run_code", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_run_code_in_sandbox_fusions_format(service):
    status, body = post(service, {"code": "print(input()[::-1])", "language": "python", "stdin": "abc\n",
                                  "run_timeout": 2, "compile_timeout": 2, "memory_limit_MB": 256})
    assert status == 200 and body["status"] == "Success"
    assert body["run_result"]["status"] == "Finished" and body["run_result"]["return_code"] == 0
    assert body["run_result"]["stdout"] == "cba\n" and body["compile_result"] is None
    _, failed = post(service, {"code": "import sys; sys.exit(3)", "language": "python"})
    assert failed["status"] == "Failed" and failed["run_result"]["return_code"] == 3
    _, slow = post(service, {"code": "while True: pass", "run_timeout": 1})
    assert slow["status"] == "Failed" and slow["run_result"]["status"] == "TimeLimitExceeded"
    assert slow["run_result"]["execution_time"] < 2.5  # the request's own timeout, under the server's cap
    _, capped = post(service, {"code": "while True: pass", "run_timeout": 60})
    assert capped["run_result"]["status"] == "TimeLimitExceeded" and capped["run_result"]["execution_time"] < 5
    _, with_file = post(service, {"code": "print(open('a.txt').read())", "files": {"a.txt": base64.b64encode(b"hi").decode()}})
    assert with_file["run_result"]["stdout"] == "hi\n"


def test_bad_requests_name_the_field(service):
    for body, message in [
        ({"code": 1}, "'code' must be a string"),
        ({"code": "x", "language": "cpp"}, "language 'cpp' is not supported"),
        ({"code": "x", "run_timeout": -1}, "'run_timeout' must be a positive number"),
        ({"code": "x", "files": {"a": "!!"}}, "files['a'] is not valid base64"),
        ({"code": "x", "fetch_files": ["a"]}, "'fetch_files' is not supported"),
    ]:
        status, answer = post(service, body)
        assert status == 400 and message in answer["message"], answer
    with urllib.request.urlopen(service + "/health", timeout=10) as response:
        health = json.loads(response.read())
    assert health["isolation"] == detect_isolation().level and health["max_concurrent"] == 2


def test_concurrency_is_bounded(service):
    """Four 1-second programs on two slots take two rounds."""
    client = FusionSandbox(service, max_concurrent=8)

    async def four():
        return await asyncio.gather(*(client.run("import time; time.sleep(1); print('ok')", timeout_s=3) for _ in range(4)))

    started = time.monotonic()
    results = asyncio.run(four())
    elapsed = time.monotonic() - started
    assert all(r.passed and r.stdout == "ok\n" for r in results)
    assert elapsed >= 2.0, f"4 programs of 1 s on 2 slots finished in {elapsed:.2f} s"


def test_fusion_client_equals_the_local_sandbox(service):
    local = LocalSandbox(SandboxLimits(wall_s=3), allow_weak_isolation=True)
    remote = FusionSandbox(service)
    code = "import sys\nprint(sum(map(int, sys.stdin.read().split())))\nprint('warn', file=sys.stderr)"

    async def both():
        return await asyncio.gather(local.run(code, stdin="1 2 3"), remote.run(code, stdin="1 2 3"))

    a, b = asyncio.run(both())
    assert (a.status, a.return_code, a.stdout, a.stderr) == (b.status, b.return_code, b.stdout, b.stderr)
    assert a.stdout == "6\n" and a.stderr == "warn\n" and b.isolation == f"remote {service}"


def test_a_sandbox_that_is_down_is_a_clear_error_after_bounded_retries():
    url = f"http://127.0.0.1:{_free_port()}"
    client = FusionSandbox(url, retries=2)
    started = time.monotonic()
    with pytest.raises(SandboxUnavailableError, match=rf"sandbox {url}/run_code is unavailable after 3 attempts"):
        asyncio.run(client.run("print(1)"))
    assert time.monotonic() - started < 5  # 0.5 + 1 s of pauses


def test_fusion_response_round_trip_and_a_real_servers_sandbox_error():
    result = RunResult(TIME_LIMIT, None, "a", "b", 1.5, "bwrap")
    body = fusion_response(result)
    assert body["status"] == "Failed" and body["run_result"]["status"] == TIME_LIMIT
    back = result_from_fusion(body, isolation="bwrap")
    assert back == result
    error = result_from_fusion({"status": "SandboxError", "message": "pod evicted", "run_result": None})
    assert error.status == "SandboxError" and error.stderr == "pod evicted"
    assert FusionRequest.from_json({"code": "x", "memory_limit_MB": -1}).memory_limit_mb is None
    with pytest.raises(FusionRequestError, match="memory_limit_MB"):
        FusionRequest.from_json({"code": "x", "memory_limit_MB": 8})


def test_weak_isolation_is_refused_unless_the_user_opts_in(monkeypatch):
    monkeypatch.setattr(isolation_module, "detect_isolation", lambda: WEAK)
    with pytest.raises(IsolationError, match=r"the code reward runs untrusted code.*'rlimits'.*allow_weak_isolation=true"):
        require_isolation(False, "the code reward")
    assert require_isolation(True, "the code reward") == WEAK


def test_weak_isolation_still_applies_every_limit():
    limits = SandboxLimits(wall_s=1.5, memory_mb=256, max_output_bytes=4096)

    async def three():
        return await asyncio.gather(*(
            run_code(code, limits=limits, isolation=WEAK)
            for code in ("print('ok')", "while True: pass", "x = bytearray(2**31)")
        ))

    ok, slow, memory = asyncio.run(three())
    assert ok.status == FINISHED and ok.stdout == "ok\n" and ok.isolation == RLIMITS
    assert slow.status == TIME_LIMIT
    assert memory.return_code == 1 and "MemoryError" in memory.stderr


def test_sandbox_command_refuses_to_serve_weakly_without_the_flag(monkeypatch, capsys):
    from hybridflow.entrypoints import sandbox as cli

    monkeypatch.setattr(isolation_module, "detect_isolation", lambda: WEAK)
    assert cli.main(["--port", "1"]) == 2
    err = capsys.readouterr().err
    assert "hybridflow sandbox runs untrusted code" in err and "Install bubblewrap" in err


def test_local_sandbox_bounds_concurrency_per_loop_and_forgets_closed_loops():
    sandbox = LocalSandbox(SandboxLimits(wall_s=5), max_concurrent=1, allow_weak_isolation=True)

    async def two():
        started = time.monotonic()
        await asyncio.gather(*(sandbox.run("import time; time.sleep(0.5)") for _ in range(2)))
        return time.monotonic() - started

    for _ in range(3):  # a new loop each time, as each scorer call and agent step makes
        assert asyncio.run(two()) >= 1.0  # one slot: the second run waited for the first
    assert len(sandbox._slots._by_loop) == 1  # only the last loop's entry; closed ones were dropped
