"""vLLM's in-process async engine behind the :class:`~hybridflow.inference.protocol.InferenceServer` protocol.

UNVERIFIED: written against the documented API of vLLM's V1 engine (0.10 – 0.11 and current
main, where ``AsyncLLMEngine`` is ``vllm.v1.engine.async_llm.AsyncLLM``) and verl's vLLM rollout,
never run here (no GPU, no vLLM). It counts as working only once ``scripts/gpu_check.sh``
(checks 5 and 6) has passed ``tests/inference/test_server_contract.py`` and 3 colocated
GRPO steps with it on a GPU machine.

Engine calls, in the order a colocated RL step makes them::

    generate(...)                       AsyncLLMEngine.generate(prompt, SamplingParams, request_id)
    sleep(2)                            AsyncLLMEngine.sleep(level=2): weights and KV cache freed
    wake_up(["weights"])                AsyncLLMEngine.wake_up(tags=["weights"])
    update_weights(named, version)      buckets → collective_rpc("hybridflow_load_bucket") →
                                        model.load_weights on every worker; reset_prefix_cache()
    wake_up(["kv_cache"])               AsyncLLMEngine.wake_up(tags=["kv_cache"]); reset_prefix_cache()

``abort_all`` aborts every tracked request (``AsyncLLMEngine.abort``), returning the tokens
each had so far. Log-probs: ``logprobs_mode="processed_logprobs"`` (vLLM >= 0.10.2) takes them
after the temperature, as the protocol asks (with top-k / top-p on, vLLM also renormalises over
the kept tokens; the built-in engine does not). ``address`` is None (no HTTP face).
"""

from __future__ import annotations

import asyncio
import dataclasses
import re
import uuid
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hybridflow.inference.adapters.common import (
    EngineLoop,
    GatedAdapter,
    RequestGate,
    check_counts,
    check_named_tensors,
    on_engine_loop,
    served_tensor_shapes,
    without_first,
)
from hybridflow.inference.protocol import (
    SamplingParams,
    StopReason,
    TokenOutput,
    TopLogProbs,
    check_sleep_level,
    check_wake_tags,
)
from hybridflow.utils.optional_engines import check_engine_installed, import_failed

if TYPE_CHECKING:
    import torch

EXTENSION = "hybridflow.inference.adapters.vllm.VLLMWeightLoader"
FINISH_REASONS: dict[str, StopReason] = {"stop": "completed", "length": "length", "abort": "aborted"}


def vllm_sampling_kwargs(
    sampling: SamplingParams, max_tokens: int, logprobs: int = 0, prompt_logprobs: int | None = None
) -> dict[str, Any]:
    """Keyword arguments of ``vllm.SamplingParams`` for one protocol request. ``logprobs`` is
    always set (0: the sampled token only): the protocol reports one log-prob per token. vLLM
    needs ``max_tokens`` >= 1, so a prompt-only request asks for one token that
    :func:`vllm_token_output` drops. ``top_k`` off is -1, which every vLLM release accepts."""
    check_counts(max_tokens, logprobs, prompt_logprobs)
    return {
        "n": 1,
        "temperature": float(sampling.temperature),  # 0 is greedy in vLLM too
        "top_p": float(sampling.top_p),
        "top_k": int(sampling.top_k) if sampling.top_k > 0 else -1,
        "seed": sampling.seed,
        "max_tokens": max(1, max_tokens),
        "logprobs": int(logprobs),
        "prompt_logprobs": None if prompt_logprobs is None else int(prompt_logprobs),
    }


def finish_stop_reason(finish_reason: str | None, aborted: bool = False) -> StopReason:
    """The protocol's stop reason for vLLM's ``finish_reason``; ``aborted``: this adapter aborted
    the request (a request that completed before the abort keeps its own reason)."""
    if finish_reason in ("stop", "length") or (finish_reason == "abort" and not aborted):
        return FINISH_REASONS[finish_reason]
    if aborted:
        return "aborted"
    raise RuntimeError(f"unexpected finish_reason {finish_reason!r} from vLLM")


def _best(entry: dict[int, Any] | None, k: int) -> list[tuple[int, float]]:
    """The ``k`` best of one position's ``{token id: Logprob}`` (vLLM adds the sampled or prompt
    token to the top ``k`` when it is not among them, so sort and cut rather than trust the size)."""
    if not entry or k <= 0:
        return []
    ranked = sorted(entry.items(), key=lambda item: -float(item[1].logprob))
    return [(int(token), float(lp.logprob)) for token, lp in ranked[:k]]


def vllm_token_output(
    output: Any,
    prompt_ids: Sequence[int],
    *,
    max_tokens: int,
    logprobs: int = 0,
    prompt_logprobs: int | None = None,
    weight_version: int = 0,
    seen: int | None = None,
    aborted: bool = False,
) -> TokenOutput:
    """The protocol's view of a vLLM ``RequestOutput`` (the default cumulative kind: every token
    so far). ``seen`` caps the tokens read at the count there was when ``output`` arrived (the
    engine appends to the same lists); ``aborted`` marks a request this adapter aborted, whose
    last output may carry no finish reason. ``output`` None: aborted before any output."""
    if output is None:
        if not aborted:
            raise RuntimeError("vLLM returned no output for a request that was not aborted")
        return TokenOutput([], [], "aborted", weight_version)
    completion = output.outputs[0]
    count = len(completion.token_ids) if seen is None else seen
    ids = [int(t) for t in list(completion.token_ids)[:count]]
    entries = list(completion.logprobs or [])[: len(ids)]
    if len(entries) != len(ids):
        raise RuntimeError(f"vLLM returned {len(ids)} tokens but {len(entries)} log-prob entries")
    stop = finish_stop_reason(completion.finish_reason, aborted)
    if max_tokens == 0:  # the token asked only because vLLM needs max_tokens >= 1
        ids, entries = [], []
        stop = "aborted" if stop == "aborted" else "length"
    top: TopLogProbs | None = [_best(e, logprobs) for e in entries] if logprobs > 0 else None
    prompt_lps: list[float] | None = None
    prompt_top: TopLogProbs | None = None
    if prompt_logprobs is not None and getattr(output, "prompt_logprobs", None) is not None:
        rest = without_first(list(output.prompt_logprobs), len(prompt_ids))  # vLLM's first entry is None
        prompt_lps = [float(e[int(t)].logprob) for t, e in zip(prompt_ids[1:], rest, strict=True)]
        prompt_top = [_best(e, prompt_logprobs) for e in rest] if prompt_logprobs > 0 else None
    return TokenOutput(
        token_ids=ids,
        log_probs=[float(e[t].logprob) for t, e in zip(ids, entries, strict=True)],
        stop_reason=stop,
        weight_version=weight_version,
        top_log_probs=top,
        prompt_log_probs=prompt_lps,
        prompt_top_log_probs=prompt_top,
    )


class VLLMWeightLoader:
    """Mixed into every vLLM GPU worker (``worker_extension_cls``); runs in the worker process."""

    def hybridflow_load_bucket(self, payload: bytes) -> int:
        from hybridflow.inference.weight_transfer import bucket_from_bytes

        tensors = bucket_from_bytes(payload)
        runner = self.model_runner  # type: ignore[attr-defined]  # set by vLLM's Worker
        model = runner.get_model() if hasattr(runner, "get_model") else runner.model
        # load_weights maps HF names onto vLLM's fused / tensor-parallel parameters (q,k,v → qkv_proj).
        model.load_weights(weights=list(tensors.items()))
        return len(tensors)


def vllm_sleep_level(version: str | None) -> int:
    """verl's rule: level 2 (discard the weights; the next update sends them all) from vLLM
    0.8.5 on, where waking a level-2 sleep works; level 1 (offload them to host memory) before,
    and when the version is unknown."""
    if not version:
        return 1
    parts = [int(p) if p.isdigit() else 0 for p in re.split(r"[.+-]", version)[:3]]
    return 2 if tuple(parts + [0] * (3 - len(parts))) >= (0, 8, 5) else 1


def _engine_factory(
    model_path: str, engine_kwargs: dict[str, Any]
) -> tuple[Callable[[], Any], Callable[..., Any], int]:
    check_engine_installed("vllm")
    try:
        import vllm
        from vllm import AsyncEngineArgs, AsyncLLMEngine
        from vllm import SamplingParams as VLLMSamplingParams
    except ImportError as err:
        raise import_failed("vllm", err) from err
    owned: dict[str, Any] = {
        "model": model_path,
        "enable_sleep_mode": True,  # sleep / wake_up need the CuMem allocator from the start
        "worker_extension_cls": EXTENSION,
    }
    if "logprobs_mode" in {f.name for f in dataclasses.fields(AsyncEngineArgs)}:
        owned["logprobs_mode"] = "processed_logprobs"  # after the temperature, as the protocol asks
    clash = sorted(set(owned) & set(engine_kwargs))
    if clash:
        raise ValueError(f"vLLM engine arguments {clash} are set by the adapter; leave them out")
    kwargs = {"gpu_memory_utilization": 0.5, **engine_kwargs, **owned}  # 0.5: verl's default, room for a trainer
    args = AsyncEngineArgs(**kwargs)
    level = vllm_sleep_level(getattr(vllm, "__version__", None))
    return (lambda: AsyncLLMEngine.from_engine_args(args)), VLLMSamplingParams, level


async def _build(factory: Callable[[], Any]) -> Any:
    return factory()  # on the engine loop: vLLM binds its output handler to the running loop


class VLLMServer(GatedAdapter):
    """:class:`~hybridflow.inference.protocol.InferenceServer` over vLLM's ``AsyncLLMEngine``.

    ``engine_kwargs`` go to ``AsyncEngineArgs`` (``dtype``, ``gpu_memory_utilization`` …; the
    rollout worker maps the rollout config onto them, see
    :mod:`hybridflow.workers.rollout.engine_settings`); ``model``, ``enable_sleep_mode``,
    ``worker_extension_cls`` and ``logprobs_mode`` are the adapter's own. ``sleep_level``: the
    level a colocated trainer sleeps at (:func:`vllm_sleep_level`). ``engine`` /
    ``sampling_params_cls`` inject a ready engine (tests). Weights travel as safetensors bytes
    of ``bucket_bytes`` through ``collective_rpc`` (a host copy: simple, not the fastest path). Every call runs on the adapter's own event loop
    (:class:`~hybridflow.inference.adapters.EngineLoop`); call :meth:`shutdown` at the end.
    """

    address: str | None = None

    def __init__(
        self,
        model_path: str | Path,
        *,
        bucket_bytes: int = 256 << 20,
        engine: Any = None,
        sampling_params_cls: Callable[..., Any] | None = None,
        **engine_kwargs: Any,
    ) -> None:
        self.model_path = str(model_path)
        factory = None
        self.sleep_level = 2  # an injected engine (tests) is taken to be a current vLLM
        if engine is None:
            factory, sampling_params_cls, self.sleep_level = _engine_factory(self.model_path, engine_kwargs)
        self._loop = EngineLoop("hybridflow-vllm")
        try:
            self._engine = engine if factory is None else self._loop.run(_build(factory))
        except BaseException:
            self._loop.close()
            raise
        self._params: Callable[..., Any] = sampling_params_cls or dict
        self._bucket_bytes = bucket_bytes
        self._shapes = served_tensor_shapes(model_path)
        self._gate = RequestGate()
        self._version = 0
        self._sleep_level = 0
        self._weights_freed = False  # a level-2 sleep freed them: the next update must send all

    @on_engine_loop
    async def generate(
        self,
        request_id: str,
        prompt_ids: list[int],
        sampling: SamplingParams,
        max_tokens: int,
        logprobs: int = 0,
        prompt_logprobs: int | None = None,
    ) -> TokenOutput:
        params = self._params(**vllm_sampling_kwargs(sampling, max_tokens, logprobs, prompt_logprobs))
        if max_tokens == 0 and prompt_logprobs is None:
            return TokenOutput([], [], "length", self._version)
        flight = await self._gate.enter(f"{request_id}-{uuid.uuid4().hex[:12]}")
        version = self._version
        last: list[Any] = [None, 0]  # the latest cumulative output, and its token count then

        async def consume() -> None:
            async for out in self._engine.generate({"prompt_token_ids": list(prompt_ids)}, params, flight.engine_id):
                last[0], last[1] = out, len(out.outputs[0].token_ids)

        flight.task = asyncio.ensure_future(consume())
        try:
            await flight.task
        except asyncio.CancelledError:
            # abort_all cancels flight.task: return what came so far. Our own caller's cancel re-raises.
            if not flight.aborted or asyncio.current_task().cancelling():  # type: ignore[union-attr]
                flight.task.cancel()
                await self._engine.abort(flight.engine_id)
                raise
        finally:
            self._gate.leave(flight)
        return vllm_token_output(
            last[0],
            prompt_ids,
            max_tokens=max_tokens,
            logprobs=logprobs,
            prompt_logprobs=prompt_logprobs,
            weight_version=version,
            seen=last[1],
            aborted=flight.aborted,
        )

    @on_engine_loop
    async def abort_all(self) -> int:
        victims = self._gate.pause()
        if victims:
            await self._engine.abort([v.engine_id for v in victims])
        for flight in victims:  # vLLM may send no last output for an aborted request: stop waiting for one
            if flight.task is not None:
                flight.task.cancel()
        await self._gate.wait_aborted(victims, self._engine.abort)
        return len(victims)

    @on_engine_loop
    async def sleep(self, level: int = 1) -> None:
        level = check_sleep_level(level)
        async with self._gate.exclusive():
            if self._gate.asleep:  # already asleep: vLLM does not stack sleeps
                return
            await self._engine.sleep(level)
            # Level 1 offloads the weights to host memory, level 2 discards them; both free the KV cache.
            self._gate.asleep = {"weights", "kv_cache"}
            self._sleep_level = level
            self._weights_freed = self._weights_freed or level == 2

    @on_engine_loop
    async def wake_up(self, tags: Sequence[str] | None = None) -> None:
        wanted = [t for t in check_wake_tags(tags) if t in self._gate.asleep]
        if wanted == ["kv_cache"] and self._sleep_level == 1 and "weights" in self._gate.asleep:
            wanted = ["weights", "kv_cache"]  # the offloaded weights come back with the cache
        async with self._gate.control:
            for tag in wanted:
                await self._engine.wake_up(tags=[tag])
                self._gate.asleep.discard(tag)
                if tag == "kv_cache":
                    await self._engine.reset_prefix_cache()
            self._gate.refresh()

    async def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> int:
        import torch

        served = getattr(getattr(self._engine, "model_config", None), "dtype", None)  # AsyncLLM.model_config
        # Checked (and a generator consumed) in the caller's thread, where its tensors live.
        pairs = check_named_tensors(
            named_tensors,
            self._shapes,
            require_all=self._weights_freed,
            served_dtype=served if isinstance(served, torch.dtype) else None,
        )
        return await self._loop.call(self._push(pairs, version))

    async def _push(self, pairs: list[tuple[str, torch.Tensor]], version: int) -> int:
        from hybridflow.inference.weight_transfer import (
            bucket_to_bytes,
            iter_weight_buckets,
        )

        async with self._gate.exclusive():
            if "weights" in self._gate.asleep:  # about to be overwritten: bring the memory back first
                await self._engine.wake_up(tags=["weights"])
                self._gate.asleep.discard("weights")
            for bucket in iter_weight_buckets(pairs, self._bucket_bytes):
                await self._engine.collective_rpc("hybridflow_load_bucket", args=(bucket_to_bytes(bucket),))
            if "kv_cache" not in self._gate.asleep:  # else the wake-up of the cache resets it
                await self._engine.reset_prefix_cache()  # cached prefixes hold KV of the old weights
            self._version, self._weights_freed = int(version), False
        return len(pairs)

    @on_engine_loop
    async def clear_kv_cache(self) -> None:
        async with self._gate.exclusive():  # vLLM refuses to reset while requests hold blocks
            if not self._gate.asleep and await self._engine.reset_prefix_cache() is False:
                raise RuntimeError("vLLM refused to reset its prefix cache")
