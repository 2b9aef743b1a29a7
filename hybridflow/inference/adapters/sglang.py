"""SGLang's offline engine (``sglang.Engine``) behind the
:class:`~hybridflow.inference.protocol.InferenceServer` protocol.

UNVERIFIED: written against the documented API of SGLang 0.4.9 – 0.5.x (and the current main
branch) and the call sequence of verl's SGLang rollout, but never run here (no GPU, SGLang
not installed). It counts as working only once ``scripts/gpu_check.sh`` (checks 5 and 6) has
passed the contract suite (``tests/inference/test_server_contract.py``) and 3 colocated GRPO
steps with it on a GPU machine.

``Engine``'s own control methods (``release_memory_occupation``, ``update_weights_from_tensor``,
``flush_cache`` …) are synchronous wrappers that run their coroutine with
``loop.run_until_complete``, which fails inside a running event loop. So, like verl's async
server, this adapter awaits the coroutines of ``Engine.tokenizer_manager`` directly::

    generate(...)                       tokenizer_manager.generate_request(GenerateReqInput(rid=…, input_ids=…))
    sleep(2)                            release_memory_occupation(tags=["kv_cache", "weights"])
    wake_up(["weights"])                resume_memory_occupation(tags=["weights"])
    update_weights(named, version)      buckets → update_weights_from_tensor(MultiprocessingSerializer
                                        payload per TP rank, flush_cache=False); then flush_cache()
    wake_up(["kv_cache"])               resume_memory_occupation(tags=["kv_cache"]); flush_cache()

``abort_all`` calls ``tokenizer_manager.abort_request(rid)`` for every tracked request (SGLang
answers each with finish reason ``abort`` and the tokens so far). Log-probs: SGLang returns
them after the temperature by default (unless ``SGLANG_RETURN_ORIGINAL_LOGPROB`` is set), over
the whole vocabulary, as the built-in engine does. ``address`` is None (no HTTP face).
"""

from __future__ import annotations

import asyncio
import inspect
import uuid
from collections.abc import Iterable, Sequence
from pathlib import Path
from types import SimpleNamespace
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

FINISH_REASONS: dict[str, StopReason] = {"stop": "completed", "length": "length", "abort": "aborted"}


def sglang_sampling_params(sampling: SamplingParams, max_tokens: int) -> dict[str, Any]:
    """SGLang's ``sampling_params`` dict for one protocol request. Temperature 0 is greedy in
    SGLang too (it switches to top-k 1); ``top_k`` off is -1 (SGLang rejects 0); a seed goes to
    ``sampling_seed`` (SGLang >= 0.5; older releases reject the key, so it is set only when
    given). ``max_new_tokens`` 0 is allowed: the prompt is scored, nothing generated."""
    if max_tokens < 0:
        raise ValueError(f"max_tokens must be >= 0, got {max_tokens}")
    params: dict[str, Any] = {
        "max_new_tokens": int(max_tokens),
        "temperature": float(sampling.temperature),
        "top_p": float(sampling.top_p),
        "top_k": int(sampling.top_k) if sampling.top_k > 0 else -1,
    }
    if sampling.seed is not None:
        params["sampling_seed"] = int(sampling.seed)
    return params


def _best(entry: list[Any] | None, k: int) -> list[tuple[int, float]]:
    """``k`` best ``(token id, log-prob)`` of one position's ``[(logprob, id, text), …]``."""
    return [(int(tid), float(lp)) for lp, tid, *_ in (entry or [])[:k]] if k > 0 else []


def finish_stop_reason(finish_reason: Any, aborted: bool = False) -> StopReason:
    """The protocol's stop reason for SGLang's ``meta_info["finish_reason"]`` (a dict with a
    ``type``, or a plain string in some releases); ``aborted``: this adapter aborted it (one
    that completed before the abort keeps its own reason)."""
    kind = finish_reason.get("type") if isinstance(finish_reason, dict) else finish_reason
    if kind in ("stop", "length") or (kind == "abort" and not aborted):
        return FINISH_REASONS[kind]
    if aborted:
        return "aborted"
    raise RuntimeError(f"unexpected finish_reason {finish_reason!r} from SGLang")


def sglang_token_output(
    out: dict[str, Any],
    prompt_ids: Sequence[int],
    *,
    logprobs: int = 0,
    prompt_logprobs: int | None = None,
    weight_version: int = 0,
    aborted: bool = False,
) -> TokenOutput:
    """The protocol's view of one ``generate_request`` result. The ids come from
    ``output_token_logprobs`` ``[(logprob, id, text), …]`` (always requested), so ids and
    log-probs cannot disagree; ``input_token_logprobs`` starts with a None for the first prompt
    token (it has no context), which is dropped."""
    meta = out.get("meta_info", {})
    entries = meta.get("output_token_logprobs") or []
    if not entries and out.get("output_ids") and not aborted:
        raise RuntimeError("SGLang returned tokens without log-probs (return_logprob was not honoured)")
    top: TopLogProbs | None = None
    if logprobs > 0:
        top = [_best(e, logprobs) for e in (meta.get("output_top_logprobs") or [])[: len(entries)]]
        top += [[] for _ in range(len(entries) - len(top))]
    prompt_lps: list[float] | None = None
    prompt_top: TopLogProbs | None = None
    if prompt_logprobs is not None and meta.get("input_token_logprobs") is not None:
        prompt_lps = [float(lp) for lp, *_ in without_first(list(meta["input_token_logprobs"]), len(prompt_ids))]
        if prompt_logprobs > 0:
            tops = without_first(list(meta.get("input_top_logprobs") or [None] * len(prompt_ids)), len(prompt_ids))
            prompt_top = [_best(e, prompt_logprobs) for e in tops]
    return TokenOutput(
        token_ids=[int(tid) for _, tid, *_ in entries],
        log_probs=[float(lp) for lp, *_ in entries],
        stop_reason=finish_stop_reason(meta.get("finish_reason"), aborted),
        weight_version=weight_version,
        top_log_probs=top,
        prompt_log_probs=prompt_lps,
        prompt_top_log_probs=prompt_top,
    )


async def _maybe_await(value: Any) -> Any:
    """Some tokenizer-manager methods became coroutines between releases; accept both."""
    return await value if inspect.isawaitable(value) else value


def _succeeded(result: Any) -> tuple[bool, str]:
    """``(success, message)`` of a tokenizer-manager control result: a tuple or an object."""
    if isinstance(result, tuple):
        return bool(result[0]), str(result[1]) if len(result) > 1 else ""
    return bool(getattr(result, "success", True)), str(getattr(result, "message", ""))


class SGLangServer(GatedAdapter):
    """:class:`~hybridflow.inference.protocol.InferenceServer` over ``sglang.Engine``.

    ``engine_kwargs`` go to ``sglang.Engine`` (its ``ServerArgs``: ``dtype``, ``tp_size``,
    ``mem_fraction_static`` …; the rollout worker maps the rollout config onto them, see
    :mod:`hybridflow.workers.rollout.engine_settings`); ``model_path`` and
    ``enable_memory_saver`` are the adapter's own (sleep / wake need the memory saver and its
    ``torch_memory_saver`` package). ``sleep_level``: the level a colocated trainer sleeps at.
    ``engine`` / ``api`` inject a ready engine and fakes of SGLang's request classes and
    serializer (tests). Every call runs on the adapter's own event loop
    (:class:`~hybridflow.inference.adapters.EngineLoop`); call :meth:`shutdown` at the end.
    """

    address: str | None = None

    def __init__(
        self,
        model_path: str | Path,
        *,
        bucket_bytes: int = 256 << 20,
        engine: Any = None,
        api: Any = None,
        **engine_kwargs: Any,
    ) -> None:
        self.model_path = str(model_path)
        if engine is None:
            check_engine_installed("sglang")
            try:
                import sglang
            except ImportError as err:
                raise import_failed("sglang", err) from err
            owned = {"model_path": self.model_path, "enable_memory_saver": True}
            clash = sorted(set(owned) & set(engine_kwargs))
            if clash:
                raise ValueError(f"SGLang engine arguments {clash} are set by the adapter; leave them out")
            kwargs = {"mem_fraction_static": 0.5, **engine_kwargs, **owned}  # 0.5: verl's default
            engine = sglang.Engine(**kwargs)  # here: it installs signal handlers
        self._loop = EngineLoop("hybridflow-sglang")  # its response loop starts with the first request
        self._engine = engine
        self._tm = engine.tokenizer_manager
        self._api = api  # .io (sglang.srt.managers.io_struct) and .serializer; loaded on first use
        self._bucket_bytes = bucket_bytes
        self._shapes = served_tensor_shapes(model_path)
        self._gate = RequestGate()
        self._version = 0
        self._weights_freed = False  # a level-2 sleep freed them: the next update must send all
        self.sleep_level = 2  # as verl: release the weights and the KV cache (every update sends all)

    def _sglang(self) -> Any:
        if self._api is None:
            from sglang.srt.managers import io_struct
            from sglang.srt.utils import MultiprocessingSerializer

            self._api = SimpleNamespace(io=io_struct, serializer=MultiprocessingSerializer)
        return self._api

    def _io(self, name: str, **fields: Any) -> Any:
        return getattr(self._sglang().io, name)(**fields)

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
        check_counts(max_tokens, logprobs, prompt_logprobs)
        params = sglang_sampling_params(sampling, max_tokens)
        if max_tokens == 0 and prompt_logprobs is None:
            return TokenOutput([], [], "length", self._version)
        flight = await self._gate.enter(f"{request_id}-{uuid.uuid4().hex[:12]}")
        version = self._version
        request = self._io(
            "GenerateReqInput",
            rid=flight.engine_id,
            input_ids=list(prompt_ids),
            sampling_params=params,
            return_logprob=True,  # the sampled tokens' log-probs are always reported
            logprob_start_len=0 if prompt_logprobs is not None else None,
            top_logprobs_num=max(logprobs, prompt_logprobs or 0),
        )
        stream = self._tm.generate_request(request, None)
        try:
            out = await stream.__anext__()
        except asyncio.CancelledError:
            await _maybe_await(self._tm.abort_request(rid=flight.engine_id))
            raise
        except Exception:
            if not flight.aborted:  # some releases raise for a request aborted before it ran
                raise
            out = {"meta_info": {"finish_reason": {"type": "abort"}}}
        finally:
            await stream.aclose()  # releases SGLang's model-update reader lock at once
            self._gate.leave(flight)
        return sglang_token_output(
            out,
            prompt_ids,
            logprobs=logprobs,
            prompt_logprobs=prompt_logprobs,
            weight_version=version,
            aborted=flight.aborted,
        )

    async def _abort(self, ids: list[str]) -> None:
        for rid in ids:
            await _maybe_await(self._tm.abort_request(rid=rid))

    @on_engine_loop
    async def abort_all(self) -> int:
        victims = self._gate.pause()
        await self._abort([v.engine_id for v in victims])
        # abort_request ignores a rid SGLang has not registered yet: wait_aborted re-sends.
        await self._gate.wait_aborted(victims, self._abort)
        return len(victims)

    @on_engine_loop
    async def sleep(self, level: int = 1) -> None:
        level = check_sleep_level(level)
        tags = ["kv_cache"] if level == 1 else ["kv_cache", "weights"]
        async with self._gate.exclusive():  # SGLang releases memory only when idle
            tags = [t for t in tags if t not in self._gate.asleep]
            if tags:
                await self._tm.release_memory_occupation(self._io("ReleaseMemoryOccupationReqInput", tags=tags), None)
                self._gate.asleep.update(tags)
                self._weights_freed = self._weights_freed or "weights" in tags

    @on_engine_loop
    async def wake_up(self, tags: Sequence[str] | None = None) -> None:
        async with self._gate.control:
            for tag in [t for t in check_wake_tags(tags) if t in self._gate.asleep]:
                await self._resume(tag)
            self._gate.refresh()

    async def _resume(self, tag: str) -> None:
        await self._tm.resume_memory_occupation(self._io("ResumeMemoryOccupationReqInput", tags=[tag]), None)
        self._gate.asleep.discard(tag)
        if tag == "kv_cache":
            await self._flush()  # the radix tree must not point into the re-allocated cache

    async def _flush(self) -> None:
        ok, message = _succeeded(await _maybe_await(self._tm.flush_cache()))
        if not ok:
            raise RuntimeError(f"SGLang refused to flush its cache: {message}")

    async def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> int:
        import torch

        served = getattr(getattr(self._tm, "model_config", None), "dtype", None)
        # Checked (and a generator consumed) in the caller's thread, where its tensors live.
        pairs = check_named_tensors(
            named_tensors,
            self._shapes,
            require_all=self._weights_freed,
            served_dtype=served if isinstance(served, torch.dtype) else None,
        )
        # CUDA tensors travel as IPC handles; the scheduler copies them into its parameters.
        device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else None
        pairs = [(n, t.detach().to(device) if device is not None else t.detach()) for n, t in pairs]
        return await self._loop.call(self._push(pairs, version))

    async def _push(self, pairs: list[tuple[str, torch.Tensor]], version: int) -> int:
        from hybridflow.inference.weight_transfer import iter_weight_buckets

        serializer = self._sglang().serializer
        tp_size = int(getattr(self._engine.server_args, "tp_size", 1))
        async with self._gate.exclusive():
            if "weights" in self._gate.asleep:  # about to be overwritten: bring the memory back first
                await self._resume("weights")
            for bucket in iter_weight_buckets(pairs, self._bucket_bytes):
                payload = [serializer.serialize(bucket) for _ in range(tp_size)]
                request = self._io(
                    "UpdateWeightsFromTensorReqInput",
                    serialized_named_tensors=payload,
                    load_format=None,
                    flush_cache=False,
                )
                ok, message = _succeeded(await self._tm.update_weights_from_tensor(request, None))
                if not ok:
                    raise RuntimeError(f"SGLang rejected the weight update: {message}")
            if "kv_cache" not in self._gate.asleep:
                await self._flush()  # cached prefixes hold KV of the old weights
            self._version, self._weights_freed = int(version), False
        return len(pairs)

    @on_engine_loop
    async def clear_kv_cache(self) -> None:
        async with self._gate.exclusive():  # SGLang flushes only when no request runs
            if not self._gate.asleep:
                await self._flush()
