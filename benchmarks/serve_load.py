"""Load and soak test of ``hybridflow serve`` over loopback: throughput, latency, errors, RSS per round.

    python benchmarks/serve_load.py                                  # tiny-llama, 6 rounds × (1, 4, 16 clients)
    python benchmarks/serve_load.py --model smollm2-135m-instruct --rounds 10 --requests 96
    python benchmarks/serve_load.py --url http://127.0.0.1:8000 --pid 12345   # a server already running

Starts the server in a child process on a free port of 127.0.0.1 (or talks to ``--url``, which
must be a loopback address: this tool never sends load anywhere else), then runs ``--rounds``
rounds. A round runs, for each client count in ``--clients``, ``--requests`` requests spread
over that many concurrent clients (threads with a keep-alive connection each). The requests are a
fixed, seeded mix of all routes — completions with prompts of varied lengths, chat, ``/generate``
with ``n = 2``, seeds, stop strings, log-probs, ``top_k``/``top_p`` — so prefill shapes vary the
way real traffic makes them vary. Every run of the script sends the same requests.

After each round it reads the server's resident set (``VmRSS`` of ``/proc/PID/status``): the
point is the trend. RSS that rises to a plateau in
the first rounds and stays there is the allocator keeping freed memory (the entry points call
``keep_freed_memory``); RSS that keeps rising round after round is a leak. The last line says
which: the growth over the second half of the rounds, in MiB.

Output: one line per (round, clients) — requests, errors, requests/s, completion tokens/s, p50
and p99 latency — and one RSS line per round; ``--out`` writes all of it as JSON.
"""

from __future__ import annotations

import argparse
import http.client
import ipaddress
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

REPO_ROOT = Path(__file__).resolve().parents[1]
STARTUP_TIMEOUT_S = 180.0
REQUEST_TIMEOUT_S = 300.0
WORDS = ("the", "model", "answers", "with", "a", "number", "seven", "plus", "three", "is", "ten", "river",
         "stone", "blue", "quickly", "under", "over", "light", "apple", "sum")


@dataclass
class Result:
    ok: bool
    latency_s: float
    completion_tokens: int
    status: int


@dataclass
class LevelReport:
    round: int
    clients: int
    requests: int
    errors: int
    wall_s: float
    requests_per_s: float
    tokens_per_s: float
    p50_ms: float
    p99_ms: float


def _percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (no interpolation: with 48 samples p99 is the slowest one)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, int(round(q / 100 * len(ordered) + 0.5)) - 1))]


def _prompt(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words))


def build_requests(seed: int, count: int, model: str, max_tokens: int,
                   max_words: int | None = None) -> list[tuple[str, dict[str, Any]]]:
    """``count`` (path, body) pairs, the same for the same arguments; ``max_words`` caps every
    prompt's length in words (token ids for /generate), None: the full mix."""
    rng = random.Random(seed)
    out: list[tuple[str, dict[str, Any]]] = []

    def words(top: int, low: int = 2) -> int:
        return rng.randint(low, top if max_words is None else max(low, min(top, max_words)))

    for i in range(count):
        tokens = rng.randint(max(1, max_tokens // 4), max_tokens)
        kind = i % 4
        if kind == 0:
            body: dict[str, Any] = {"model": model, "prompt": _prompt(rng, words(120)), "max_tokens": tokens,
                                    "temperature": rng.choice([0, 0.7, 1.0]), "logprobs": rng.choice([None, 0, 3])}
            out.append(("/v1/completions", body))
        elif kind == 1:
            body = {"model": model, "messages": [{"role": "user", "content": _prompt(rng, words(60))}],
                    "max_tokens": tokens, "temperature": 1.0, "top_p": 0.9, "seed": rng.randint(0, 2**31),
                    "stop": ["seven", "\n\n"]}
            out.append(("/v1/chat/completions", body))
        elif kind == 2:
            ids = [rng.randint(5, 200) for _ in range(words(90, low=3))]
            body = {"input_ids": ids, "sampling_params": {"max_new_tokens": tokens, "temperature": 1.0, "n": 2,
                                                          "top_k": 20, "ignore_eos": True}, "top_logprobs": 2}
            out.append(("/generate", body))
        else:
            prompts = [_prompt(rng, words(40)) for _ in range(rng.randint(1, 3))]
            body = {"model": model, "prompt": prompts, "max_tokens": tokens, "temperature": 0.8, "n": 2}
            out.append(("/v1/completions", body))
    return out


class Client:
    """One keep-alive HTTP connection to the server."""

    def __init__(self, host: str, port: int, api_key: str | None) -> None:
        self.host, self.port = host, port
        self.headers = {"Content-Type": "application/json"}
        if api_key:
            self.headers["Authorization"] = f"Bearer {api_key}"
        self.conn = http.client.HTTPConnection(host, port, timeout=REQUEST_TIMEOUT_S)

    def call(self, method: str, path: str, body: dict[str, Any] | None = None) -> tuple[int, dict[str, Any]]:
        data = None if body is None else json.dumps(body).encode()
        try:
            self.conn.request(method, path, body=data, headers=self.headers)
            resp = self.conn.getresponse()
            payload = resp.read()
        except (http.client.HTTPException, OSError):
            self.conn.close()  # a broken keep-alive connection: reconnect once
            self.conn = http.client.HTTPConnection(self.host, self.port, timeout=REQUEST_TIMEOUT_S)
            self.conn.request(method, path, body=data, headers=self.headers)
            resp = self.conn.getresponse()
            payload = resp.read()
        try:
            parsed = json.loads(payload)
        except json.JSONDecodeError:
            parsed = {"raw": payload[:200].decode(errors="replace")}
        return resp.status, parsed

    def close(self) -> None:
        self.conn.close()


def run_level(host: str, port: int, api_key: str | None, requests: list[tuple[str, dict[str, Any]]],
              clients: int) -> tuple[list[Result], float]:
    """Send ``requests`` over ``clients`` concurrent connections; results and wall time."""
    results: list[Result] = []
    lock = threading.Lock()
    queue = list(reversed(requests))

    def worker() -> None:
        client = Client(host, port, api_key)
        try:
            while True:
                with lock:
                    if not queue:
                        return
                    path, body = queue.pop()
                start = time.perf_counter()
                try:
                    status, reply = client.call("POST", path, body)
                except (http.client.HTTPException, OSError):
                    status, reply = 0, {}
                elapsed = time.perf_counter() - start
                tokens = int(reply.get("usage", {}).get("completion_tokens", 0)) if status == 200 else 0
                with lock:
                    results.append(Result(status == 200, elapsed, tokens, status))
        finally:
            client.close()

    threads = [threading.Thread(target=worker) for _ in range(clients)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results, time.perf_counter() - start


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_server(args: argparse.Namespace, port: int, log: Path) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "hybridflow.cli", "serve", "--model", args.model, "--host", "127.0.0.1",
           "--port", str(port), "--dtype", args.dtype, "--max-batch-rows", str(args.max_batch_rows)]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO_ROOT)}
    if args.api_key:
        env["HYBRIDFLOW_API_KEY"] = args.api_key
    with log.open("w") as fh:
        return subprocess.Popen(cmd, cwd=REPO_ROOT, env=env, stdout=fh, stderr=subprocess.STDOUT)


def wait_ready(host: str, port: int, api_key: str | None, process: subprocess.Popen | None, log: Path | None) -> str:
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"server exited with {process.returncode}:\n{log.read_text() if log else ''}")
        try:
            status, body = Client(host, port, api_key).call("GET", "/v1/models")
            if status == 200:
                return body["data"][0]["id"]
        except (OSError, http.client.HTTPException):
            pass
        time.sleep(0.3)
    raise RuntimeError("server not ready in time")


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="tiny-llama")
    parser.add_argument("--dtype", default="auto", choices=["auto", "fp32", "bf16"])
    parser.add_argument("--max-batch-rows", type=int, default=64)
    parser.add_argument("--url", default=None, help="a running server on a loopback address (default: start one)")
    parser.add_argument("--pid", type=int, default=None, help="the --url server's process id, for RSS")
    parser.add_argument("--api-key", default=None)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--clients", default="1,4,16", help="concurrent client counts, run in this order each round")
    parser.add_argument("--requests", type=int, default=48, help="requests per (round, client count)")
    parser.add_argument("--max-tokens", type=int, default=24, help="upper end of the per-request token limit")
    parser.add_argument("--max-prompt-words", type=int, default=None,
                        help="cap every prompt at this many words (short requests; default: the full mix, up to 120)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=None, help="write the report as JSON here")
    args = parser.parse_args(argv)
    levels = [int(c) for c in args.clients.split(",")]
    if args.rounds < 1 or args.requests < 1 or min(levels) < 1:
        parser.error("--rounds, --requests and every --clients value must be >= 1")

    process, log = None, None
    if args.url:
        url = urlparse(args.url)
        host, port = url.hostname or "", url.port or 80
        if not _loopback(host):
            parser.error(f"--url must be a loopback address (127.0.0.1, ::1, localhost), got {host!r}")
        pid = args.pid
    else:
        host, port = "127.0.0.1", _free_port()
        log = Path(f"/tmp/serve_load_{port}.log")
        process = start_server(args, port, log)
        pid = process.pid
    report: dict[str, Any] = {"args": vars(args), "levels": [], "rss_mib": []}
    try:
        model = wait_ready(host, port, args.api_key, process, log)
        # Warm-up: one round's worth at the highest concurrency, so the first measured round
        # does not carry one-off costs (weight packing, first allocations).
        run_level(host, port, args.api_key,
                  build_requests(args.seed + 999, args.requests, model, args.max_tokens, args.max_prompt_words),
                  max(levels))
        if pid:
            report["rss_after_warmup_mib"] = rss_mib(pid)
            print(f"RSS after warm-up: {report['rss_after_warmup_mib']:.0f} MiB", flush=True)
        print(f"{'round':>5} {'clients':>7} {'reqs':>5} {'errors':>6} {'req/s':>7} {'tok/s':>7} "
              f"{'p50 ms':>8} {'p99 ms':>8}", flush=True)
        for r in range(args.rounds):
            for clients in levels:
                # The same requests every round: any growth is not from new kinds of input.
                requests = build_requests(args.seed + clients, args.requests, model, args.max_tokens,
                                          args.max_prompt_words)
                results, wall = run_level(host, port, args.api_key, requests, clients)
                latencies = [x.latency_s * 1000 for x in results if x.ok] or [float("nan")]
                level = LevelReport(r, clients, len(results), sum(not x.ok for x in results), round(wall, 3),
                                    round(len(results) / wall, 2),
                                    round(sum(x.completion_tokens for x in results) / wall, 1),
                                    round(statistics.median(latencies), 1), round(_percentile(latencies, 99), 1))
                report["levels"].append(asdict(level))
                print(f"{r:>5} {clients:>7} {level.requests:>5} {level.errors:>6} {level.requests_per_s:>7.2f} "
                      f"{level.tokens_per_s:>7.1f} {level.p50_ms:>8.1f} {level.p99_ms:>8.1f}", flush=True)
            if pid:
                rss = rss_mib(pid)
                report["rss_mib"].append(rss)
                print(f"      RSS after round {r}: {rss:.0f} MiB", flush=True)
        rss = report["rss_mib"]
        if len(rss) >= 2:
            half = rss[len(rss) // 2 - (1 if len(rss) % 2 == 0 else 0):]
            report["rss_growth_second_half_mib"] = round(half[-1] - half[0], 1)
            print(f"RSS: {rss[0]:.0f} MiB after round 0, {rss[-1]:.0f} MiB after round {len(rss) - 1}; "
                  f"growth over the second half of the rounds: {half[-1] - half[0]:+.1f} MiB", flush=True)
        report["errors"] = sum(level["errors"] for level in report["levels"])
    finally:
        if process is not None:
            process.terminate()
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=2))
    return 1 if report.get("errors") else 0


if __name__ == "__main__":
    sys.exit(main())
