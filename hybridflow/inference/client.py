"""Token clients on the built-in engine: in this process, or over HTTP against ``hybridflow serve``.

Both implement :class:`~hybridflow.inference.protocol.TokenClient` — token ids in, the
sampler's own ids and log-probs out — so an agent loop cannot tell which one it talks to.

* :class:`InProcessClient` hands a :class:`~hybridflow.inference.continuous.GenRequest` to a
  running :class:`~hybridflow.inference.engine.GenerationEngine` and awaits its future. The
  engine thread batches whatever is in flight, so many trajectories awaiting ``generate`` at
  once (``asyncio.gather``) share forward passes without any coordination here.
* :class:`HttpClient` posts to the server's ``/generate`` route, which feeds the same engine.

Routing: ``request_id`` names the trajectory. Both clients talk to exactly one engine, so
every request of a trajectory lands on the same engine (and, once the batcher keeps a prefix
cache, can reuse it); a client over several replicas must keep that property by routing on
``request_id``.

Stop reasons: the batcher's ``"stop"`` (a stop token) becomes ``completed``, ``"length"``
stays ``length``; a request the engine dropped — cancelled, or the engine shutting down —
comes back ``aborted`` with no tokens (the engine does not hand back partial responses).
"""

from __future__ import annotations

import asyncio
import json
import threading
import urllib.error
import urllib.request
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from hybridflow.inference.continuous import FINISH_LENGTH, FINISH_STOP, GenRequest, SampleOutput
from hybridflow.inference.engine import GenerationEngine, RequestCancelled, ShuttingDown
from hybridflow.inference.protocol import SamplingParams, StopReason, TokenOutput
from hybridflow.inference.sampling import SamplingParams as BatcherSampling

_STOP_REASONS: dict[str, StopReason] = {FINISH_STOP: "completed", FINISH_LENGTH: "length"}


class InferenceRequestError(RuntimeError):
    """The engine or server refused or failed a request for a reason other than an abort."""


def stop_reason(finish_reason: str | None) -> StopReason:
    """The protocol's stop reason for a batcher / ``/generate`` ``finish_reason``."""
    if finish_reason not in _STOP_REASONS:
        raise InferenceRequestError(f"unexpected finish_reason {finish_reason!r} from the engine")
    return _STOP_REASONS[finish_reason]


def batcher_params(sampling: SamplingParams, max_tokens: int, stop_token_ids: Sequence[int]) -> BatcherSampling:
    """The batcher's settings for one protocol request: ``n`` = 1, greedy when temperature is 0.

    ``top_k`` -1 and 0 both mean off in both classes, so it passes through unchanged.
    """
    return BatcherSampling(
        max_new_tokens=max_tokens,
        temperature=sampling.temperature,
        top_k=sampling.top_k,
        top_p=sampling.top_p,
        do_sample=sampling.temperature > 0,
        n=1,
        stop_token_ids=tuple(stop_token_ids),
    )


def _model_eos_ids(model: Any) -> tuple[int, ...]:
    """The model's own end-of-sequence ids (``generation_config`` first, then ``config``)."""
    for source in (getattr(model, "generation_config", None), getattr(model, "config", None)):
        eos = getattr(source, "eos_token_id", None)
        if eos is not None:
            return (int(eos),) if isinstance(eos, int) else tuple(int(e) for e in eos)
    return ()


def _empty(stop: StopReason, weight_version: int) -> TokenOutput:
    return TokenOutput(token_ids=[], log_probs=[], stop_reason=stop, weight_version=weight_version)


class InProcessClient:
    """A :class:`TokenClient` over a :class:`GenerationEngine` running in this process.

    ``stop_token_ids`` end a response (the stop token is kept); default: the served model's EOS
    ids, as ``hybridflow serve`` uses. The engine must be started (:meth:`GenerationEngine.start`)
    and stays owned by the caller: closing the client does not stop it.

    Cancelling the awaiting task cancels the request in the engine (it leaves the batch at the
    next step) and re-raises :class:`asyncio.CancelledError`, as asyncio code expects.
    """

    def __init__(self, engine: GenerationEngine, stop_token_ids: Sequence[int] | None = None) -> None:
        self.engine = engine
        self.stop_token_ids = tuple(stop_token_ids) if stop_token_ids is not None else _model_eos_ids(engine.model)

    async def generate(
        self, request_id: str, prompt_ids: list[int], sampling: SamplingParams, max_tokens: int
    ) -> TokenOutput:
        """Generate up to ``max_tokens`` tokens after ``prompt_ids`` on the engine thread."""
        if max_tokens < 1:  # nothing may be generated: the budget is already spent
            return _empty("length", self.engine.weight_version)
        request = GenRequest(
            tuple(int(t) for t in prompt_ids), batcher_params(sampling, max_tokens, self.stop_token_ids),
            seed=sampling.seed,
        )
        future = self.engine.submit(request)
        try:
            outputs: list[SampleOutput] = await asyncio.wrap_future(future)
        except asyncio.CancelledError:
            self.engine.cancel(future)  # wrap_future cancels only a request not yet admitted
            raise
        except (RequestCancelled, ShuttingDown):
            return _empty("aborted", self.engine.weight_version)
        out = outputs[0]
        return TokenOutput(
            token_ids=list(out.token_ids), log_probs=list(out.logprobs),
            stop_reason=stop_reason(out.finish_reason), weight_version=out.weight_version,
        )


class HttpClient:
    """A :class:`TokenClient` that posts to ``hybridflow serve``'s ``/generate`` route.

    ``base_url`` is the server root (``http://127.0.0.1:8000``, no ``/v1``); ``api_key`` is sent
    as a bearer token. The server always stops at the model's EOS ids; ``stop_token_ids`` adds
    more. Requests run in a pool of ``max_connections`` threads (the standard library's
    ``urllib``: the serve extra does not bring an async HTTP client), so up to that many
    trajectories wait on the server at once — where the engine batches them.

    A 503 (the server is shutting down) comes back ``aborted``; any other error status raises
    :class:`InferenceRequestError` with the server's message. Cancelling the awaiting task does
    not stop the HTTP call already in a thread; its answer is dropped.
    """

    def __init__(
        self,
        base_url: str,
        *,
        api_key: str | None = None,
        stop_token_ids: Sequence[int] = (),
        timeout_s: float = 600.0,
        max_connections: int = 64,
    ) -> None:
        if max_connections < 1:
            raise ValueError(f"max_connections must be >= 1, got {max_connections}")
        self.base_url = base_url.rstrip("/")
        self.api_key = api_key
        self.stop_token_ids = tuple(int(t) for t in stop_token_ids)
        self.timeout_s = timeout_s
        self._max_connections = max_connections
        self._pool: ThreadPoolExecutor | None = None
        self._pool_lock = threading.Lock()

    def _executor(self) -> ThreadPoolExecutor:
        with self._pool_lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self._max_connections, thread_name_prefix="hybridflow-http-client")
            return self._pool

    def close(self) -> None:
        """Release the connection threads (requests in flight finish first)."""
        with self._pool_lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True)

    def body(self, prompt_ids: list[int], sampling: SamplingParams, max_tokens: int) -> dict[str, Any]:
        """The ``/generate`` request for one protocol call (``n`` = 1)."""
        params: dict[str, Any] = {
            "max_new_tokens": max_tokens,
            "temperature": float(sampling.temperature),
            "top_p": float(sampling.top_p),
            "top_k": int(sampling.top_k),
            "n": 1,
            "stop_token_ids": list(self.stop_token_ids),
        }
        if sampling.seed is not None:
            params["seed"] = int(sampling.seed)
        return {"input_ids": [int(t) for t in prompt_ids], "sampling_params": params}

    def _post(self, path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        request = urllib.request.Request(
            self.base_url + path, data=json.dumps(body).encode(), method="POST", headers=headers
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as err:
            raw = err.read()
            try:
                return err.code, json.loads(raw)
            except ValueError:
                return err.code, {"error": {"message": raw.decode(errors="replace")[:500]}}

    async def generate(
        self, request_id: str, prompt_ids: list[int], sampling: SamplingParams, max_tokens: int
    ) -> TokenOutput:
        """Generate up to ``max_tokens`` tokens after ``prompt_ids`` on the server."""
        if max_tokens < 1:
            return _empty("length", 0)
        loop = asyncio.get_running_loop()
        status, reply = await loop.run_in_executor(
            self._executor(), self._post, "/generate", self.body(prompt_ids, sampling, max_tokens)
        )
        if status == 503:
            return _empty("aborted", 0)
        if status != 200:
            message = reply.get("error", {}).get("message", reply) if isinstance(reply, dict) else reply
            raise InferenceRequestError(f"{self.base_url}/generate answered {status} for {request_id!r}: {message}")
        out = reply["outputs"][0]
        return TokenOutput(
            token_ids=[int(t) for t in out["output_ids"]],
            log_probs=[float(x) for x in out["logprobs"]],
            stop_reason=stop_reason(out["finish_reason"]),
            weight_version=int(out.get("weight_version", 0)),
        )
