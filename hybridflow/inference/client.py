"""Token clients on the built-in engine: in this process, or over HTTP against ``hybridflow serve``.

Both implement :class:`~hybridflow.inference.protocol.TokenClient` — token ids in, the
sampler's own ids and log-probs out — so an agent loop cannot tell which one it talks to.

* :class:`InProcessClient` hands a :class:`~hybridflow.inference.batcher_types.GenRequest` to a
  running :class:`~hybridflow.inference.generation_engine.GenerationEngine` and awaits its future. The
  engine thread batches whatever is in flight, so many trajectories awaiting ``generate`` at
  once (``asyncio.gather``) share forward passes without any coordination here.
* :class:`HttpClient` posts to the server's ``/generate`` route, which feeds the same engine.

Routing: ``request_id`` names the trajectory. Both clients talk to exactly one engine, so
every request of a trajectory lands on the same engine (and, once the batcher keeps a prefix
cache, can reuse it); a client over several replicas must keep that property by routing on
``request_id``.

Both implement the whole :class:`~hybridflow.inference.protocol.InferenceServer` (abort,
resume, sleep, wake, weight updates, KV-cache clearing, prompt log-probs); the HTTP client
speaks the server's control routes (see :mod:`hybridflow.server.control`).

Stop reasons: the batcher's ``"stop"`` (a stop token) becomes ``completed``, ``"length"``
stays ``length``, ``"abort"`` (``abort_all``) becomes ``aborted`` with the tokens so far; a
request the engine dropped — cancelled, or the engine shutting down — comes back ``aborted``
with no tokens.
"""

from __future__ import annotations

import asyncio
import json
import threading
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch

from hybridflow.inference.batcher_types import (
    FINISH_ABORT,
    FINISH_LENGTH,
    FINISH_STOP,
    GenRequest,
    SampleOutput,
)
from hybridflow.inference.engine_queue import RequestCancelled, ShuttingDown
from hybridflow.inference.generation_engine import GenerationEngine
from hybridflow.inference.protocol import (
    PromptImages,
    SamplingParams,
    StopReason,
    TokenOutput,
    check_sleep_level,
    check_wake_tags,
)
from hybridflow.inference.sampling import GenerationParams
from hybridflow.inference.weight_transfer import safetensors_buckets

_HEADER_SLACK = 64 * 1024  # room for a bucket's safetensors header under the server's body limit
_STOP_REASONS: dict[str, StopReason] = {FINISH_STOP: "completed", FINISH_LENGTH: "length", FINISH_ABORT: "aborted"}


class InferenceRequestError(RuntimeError):
    """The engine or server refused or failed a request for a reason other than an abort."""


def stop_reason(finish_reason: str | None) -> StopReason:
    """The protocol's stop reason for a batcher / ``/generate`` ``finish_reason``."""
    if finish_reason not in _STOP_REASONS:
        raise InferenceRequestError(f"unexpected finish_reason {finish_reason!r} from the engine")
    return _STOP_REASONS[finish_reason]


def batcher_params(sampling: SamplingParams, max_tokens: int, stop_token_ids: Sequence[int]) -> GenerationParams:
    """The batcher's settings for one protocol request: ``n`` = 1, greedy when temperature is 0.

    ``top_k`` -1 and 0 both mean off in both classes, so it passes through unchanged.
    """
    return GenerationParams(
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


def _tops(rows: Any) -> list[list[tuple[int, float]]] | None:
    if rows is None:
        return None
    return [[(int(i), float(lp)) for i, lp in row] for row in rows]


def token_output(out: SampleOutput, logprobs: int = 0) -> TokenOutput:
    """The protocol's view of one batcher output."""
    return TokenOutput(
        token_ids=list(out.token_ids),
        log_probs=list(out.logprobs),
        stop_reason=stop_reason(out.finish_reason),
        weight_version=out.weight_version,
        top_log_probs=_tops(out.top_logprobs) if logprobs > 0 else None,
        prompt_log_probs=list(out.prompt_logprobs) if out.prompt_logprobs is not None else None,
        prompt_top_log_probs=_tops(out.prompt_top_logprobs),
    )


class InProcessClient:
    """An :class:`~hybridflow.inference.protocol.InferenceServer` over a
    :class:`GenerationEngine` running in this process.

    ``stop_token_ids`` end a response (the stop token is kept); default: the served model's EOS
    ids, as ``hybridflow serve`` uses. The engine must be started (:meth:`GenerationEngine.start`)
    and stays owned by the caller: closing the client does not stop it.

    Cancelling the awaiting task cancels the request in the engine (it leaves the batch at the
    next step) and re-raises :class:`asyncio.CancelledError`, as asyncio code expects.
    """

    address: str | None = None

    def __init__(self, engine: GenerationEngine, stop_token_ids: Sequence[int] | None = None) -> None:
        self.engine = engine
        self.stop_token_ids = tuple(stop_token_ids) if stop_token_ids is not None else _model_eos_ids(engine.model)

    async def generate(
        self,
        request_id: str,
        prompt_ids: list[int],
        sampling: SamplingParams,
        max_tokens: int,
        logprobs: int = 0,
        prompt_logprobs: int | None = None,
        images: PromptImages | None = None,
    ) -> TokenOutput:
        """Generate up to ``max_tokens`` tokens after ``prompt_ids`` on the engine thread;
        ``images``: the prompt's images and 3-D positions (a vision-language model)."""
        if max_tokens < 1:  # nothing may be generated: the budget is already spent
            if prompt_logprobs is None:
                return _empty("length", self.engine.weight_version)
            scores, top = await asyncio.wrap_future(self.engine.score_prompt(prompt_ids, prompt_logprobs))
            return TokenOutput(
                [], [], "length", self.engine.weight_version, prompt_log_probs=scores, prompt_top_log_probs=top
            )
        request = GenRequest(
            tuple(int(t) for t in prompt_ids),
            batcher_params(sampling, max_tokens, self.stop_token_ids),
            top_logprobs=logprobs,
            seed=sampling.seed,
            images=images.inputs if images is not None else None,
            prompt_positions=images.positions_for(len(prompt_ids)) if images is not None else None,
        )
        future = self.engine.submit(request, prompt_logprobs)
        try:
            outputs: list[SampleOutput] = await asyncio.wrap_future(future)
        except asyncio.CancelledError:
            self.engine.cancel(future)  # wrap_future cancels only a request not yet admitted
            raise
        except (RequestCancelled, ShuttingDown):
            return _empty("aborted", self.engine.weight_version)
        return token_output(outputs[0], logprobs)

    async def abort_all(self) -> int:
        return await asyncio.wrap_future(self.engine.abort_all())

    async def resume_generation(self) -> None:
        await asyncio.wrap_future(self.engine.resume_generation())

    async def sleep(self, level: int = 1) -> None:
        await asyncio.wrap_future(self.engine.sleep(level))

    async def wake_up(self, tags: Sequence[str] | None = None) -> None:
        await asyncio.wrap_future(self.engine.wake_up(tags))

    async def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> int:
        # Staging copies the tensors on this thread; keep the event loop free meanwhile.
        loop = asyncio.get_running_loop()
        future = await loop.run_in_executor(None, self.engine.update_weights_from_tensors, named_tensors, version)
        return await asyncio.wrap_future(future)

    async def clear_kv_cache(self) -> None:
        await asyncio.wrap_future(self.engine.clear_kv_cache())

    async def get_weight_version(self) -> int:
        return self.engine.weight_version


class HttpClient:
    """An :class:`~hybridflow.inference.protocol.InferenceServer` over ``hybridflow serve``'s HTTP routes.

    ``base_url`` is the server root (``http://127.0.0.1:8000``, no ``/v1``); ``api_key`` is sent
    as a bearer token. The server always stops at the model's EOS ids; ``stop_token_ids`` adds
    more. Requests run in a pool of ``max_connections`` threads (the standard library's
    ``urllib``: the serve extra does not bring an async HTTP client), so up to that many
    trajectories wait on the server at once — where the engine batches them.

    The controls (abort, resume, sleep, wake, ``update_weights``, KV cache) need a server
    started with ``--control-routes``. ``update_weights`` posts safetensors buckets of at most
    ``weight_bucket_bytes`` (a larger tensor travels alone); the server swaps them in after the
    last one.

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
        weight_bucket_bytes: int = 64 * 1024 * 1024,
    ) -> None:
        if max_connections < 1:
            raise ValueError(f"max_connections must be >= 1, got {max_connections}")
        self.base_url = base_url.rstrip("/")
        self.address = self.base_url.split("://", 1)[-1]
        self.api_key = api_key
        self.stop_token_ids = tuple(int(t) for t in stop_token_ids)
        self.timeout_s = timeout_s
        self.weight_bucket_bytes = weight_bucket_bytes
        self._max_connections = max_connections
        self.buckets_sent = 0  # weight buckets posted, for metrics
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

    def body(
        self,
        prompt_ids: list[int],
        sampling: SamplingParams,
        max_tokens: int,
        logprobs: int = 0,
        prompt_logprobs: int | None = None,
    ) -> dict[str, Any]:
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
        body: dict[str, Any] = {"input_ids": [int(t) for t in prompt_ids], "sampling_params": params}
        if logprobs:
            body["top_logprobs"] = int(logprobs)
        if prompt_logprobs is not None:
            body["prompt_logprobs"] = int(prompt_logprobs)
        return body

    def _request(
        self, method: str, path: str, body: dict[str, Any] | bytes | None = None
    ) -> tuple[int, dict[str, Any]]:
        headers = {"Content-Type": "application/octet-stream" if isinstance(body, bytes) else "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        data = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
        if data is None and method == "POST":
            data = b"{}"
        request = urllib.request.Request(self.base_url + path, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as err:
            raw = err.read()
            try:
                return err.code, json.loads(raw)
            except ValueError:
                return err.code, {"error": {"message": raw.decode(errors="replace")[:500]}}
        except (urllib.error.URLError, OSError) as err:  # refused, reset, timed out
            raise InferenceRequestError(f"{self.base_url}{path.split('?')[0]}: no answer ({err})") from err

    def _post(self, path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        return self._request("POST", path, body)

    async def _call(self, method: str, path: str, body: dict[str, Any] | bytes | None = None) -> dict[str, Any]:
        """One control call; any status but 200 raises :class:`InferenceRequestError`."""
        loop = asyncio.get_running_loop()
        status, reply = await loop.run_in_executor(self._executor(), self._request, method, path, body)
        if status != 200:
            raise InferenceRequestError(f"{self.base_url}{path.split('?')[0]} answered {status}: {_message(reply)}")
        return reply

    async def generate(
        self,
        request_id: str,
        prompt_ids: list[int],
        sampling: SamplingParams,
        max_tokens: int,
        logprobs: int = 0,
        prompt_logprobs: int | None = None,
        images: PromptImages | None = None,
    ) -> TokenOutput:
        """Generate up to ``max_tokens`` tokens after ``prompt_ids`` on the server (text only:
        ``/generate`` takes token ids, so ``images`` is refused)."""
        if images is not None:
            raise InferenceRequestError(
                f"{self.base_url}/generate takes token ids only: prompts with images are not sent over HTTP yet "
                "(the built-in rollout's in-process engine takes them)"
            )
        if max_tokens < 1 and prompt_logprobs is None:
            return _empty("length", 0)
        loop = asyncio.get_running_loop()
        status, reply = await loop.run_in_executor(
            self._executor(),
            self._post,
            "/generate",
            self.body(prompt_ids, sampling, max(max_tokens, 0), logprobs, prompt_logprobs),
        )
        if status == 503:
            return _empty("aborted", 0)
        if status != 200:
            raise InferenceRequestError(
                f"{self.base_url}/generate answered {status} for {request_id!r}: {_message(reply)}"
            )
        out = reply["outputs"][0]
        return TokenOutput(
            token_ids=[int(t) for t in out["output_ids"]],
            log_probs=[float(x) for x in out["logprobs"]],
            stop_reason=stop_reason(out["finish_reason"]),
            weight_version=int(out.get("weight_version", 0)),
            top_log_probs=_tops(out.get("top_logprobs")) if logprobs > 0 else None,
            prompt_log_probs=[float(x) for x in out["prompt_logprobs"]] if "prompt_logprobs" in out else None,
            prompt_top_log_probs=_tops(out.get("prompt_top_logprobs")),
        )

    async def abort_all(self) -> int:
        return int((await self._call("POST", "/abort_all"))["aborted"])

    async def resume_generation(self) -> None:
        await self._call("POST", "/resume_generation")

    async def sleep(self, level: int = 1) -> None:
        await self._call("POST", "/sleep", {"level": check_sleep_level(level)})

    async def wake_up(self, tags: Sequence[str] | None = None) -> None:
        await self._call("POST", "/wake_up", {"tags": list(check_wake_tags(tags))})

    async def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> int:
        """Post the tensors bucket by bucket (one bucket serialised at a time); returns the
        tensors the server copied. Buckets are kept under the server's body limit for this
        route; a single tensor over it raises before anything is sent. A refused bucket raises
        and leaves the old weights serving."""
        limit = int((await self._call("GET", "/weight_version")).get("max_weight_bucket_bytes") or 0)
        bucket_bytes = (
            self.weight_bucket_bytes if not limit else max(1, min(self.weight_bucket_bytes, limit - _HEADER_SLACK))
        )
        update_id = uuid.uuid4().hex
        buckets = iter(safetensors_buckets(named_tensors, bucket_bytes))
        current = next(buckets, None)
        if current is None:
            raise ValueError("update_weights got no tensors")
        index = 0
        while current is not None:
            if limit and len(current) > limit:
                raise InferenceRequestError(
                    f"weight bucket {index} is {len(current)} bytes (one tensor larger than a bucket travels alone), "
                    f"over the server's limit of {limit} bytes: start it with a larger --max-weight-bucket-mb"
                )
            following = next(buckets, None)
            final = int(following is None)
            query = f"?update_id={update_id}&bucket={index}&final={final}&version={int(version)}"
            reply = await self._call("POST", "/update_weights" + query, current)
            self.buckets_sent += 1
            current, index = following, index + 1
        return int(reply["num_tensors"])

    async def update_weights_from_disk(self, model_path: str, version: int | None = None) -> int:
        """Have the server load a folder under its ``--weights-root``; returns the tensors copied."""
        body: dict[str, Any] = {"model_path": model_path}
        if version is not None:
            body["version"] = int(version)
        return int((await self._call("POST", "/update_weights_from_disk", body))["num_tensors"])

    async def clear_kv_cache(self) -> None:
        await self._call("POST", "/clear_kv_cache")

    async def get_weight_version(self) -> int:
        return int((await self._call("GET", "/weight_version"))["weight_version"])


def _message(reply: Any) -> Any:
    return reply.get("error", {}).get("message", reply) if isinstance(reply, dict) else reply
