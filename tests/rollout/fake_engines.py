"""Stand-ins for the ``vllm`` and ``sglang`` packages, installed into ``sys.modules``.

vLLM and SGLang are CUDA-only, so they cannot run on the CPU machines the suite runs on. These
fakes answer the few calls the adapters make (engine construction, generation, sleep / wake,
weight loading, cache resets) and record every one of them, in order, in ``EVENTS``: the real
adapters and the real rollout worker run against them unchanged, so a test sees exactly what the
engines would be asked and in which order. Generated tokens are a seeded function of the request
(ids 4–499, an EOS now and then), so trainings on them are deterministic.
"""

from __future__ import annotations

import dataclasses
import importlib.machinery
import random
import sys
import types
from types import SimpleNamespace as NS
from typing import Any

import pytest
import torch

from hybridflow.inference.weight_transfer import bucket_from_bytes

EOS = 2  # <|im_end|> in the tiny tokenizer
EVENTS: list[tuple[Any, ...]] = []


def _tokens(seed: Any, prompt: list[int], count: int) -> list[int]:
    rng = random.Random(f"{seed}-{prompt}")
    ids = [rng.randrange(4, 500) for _ in range(count)]
    stop = rng.randrange(1, count + 2)  # past the end: no EOS, the response runs to the length limit
    return ids[:stop] if stop > count else [*ids[: stop - 1], EOS]


# --- vLLM -----------------------------------------------------------------------------------------


@dataclasses.dataclass
class FakeEngineArgs:
    """``AsyncEngineArgs``: an unknown keyword is a TypeError, as in vLLM."""

    model: str
    enable_sleep_mode: bool = False
    worker_extension_cls: str = ""
    logprobs_mode: str = "raw_logprobs"
    dtype: str = "auto"
    gpu_memory_utilization: float = 0.9
    tensor_parallel_size: int = 1
    max_model_len: int | None = None
    enforce_eager: bool = False
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    enable_chunked_prefill: bool | None = None
    enable_prefix_caching: bool | None = None
    load_format: str = "auto"
    disable_log_stats: bool = False
    seed: int | None = 0
    swap_space: float = 4


class FakeAsyncLLM:
    def __init__(self, args: FakeEngineArgs) -> None:
        self.model_config = NS(dtype=torch.float32)
        EVENTS.append(("vllm.init", dataclasses.asdict(args)))

    @classmethod
    def from_engine_args(cls, args: FakeEngineArgs) -> FakeAsyncLLM:
        return cls(args)

    async def generate(self, prompt: dict[str, Any], params: dict[str, Any], request_id: str) -> Any:
        EVENTS.append(("generate",))
        ids = _tokens(params["seed"], prompt["prompt_token_ids"], params["max_tokens"])
        logprob = NS(logprob=-0.5)
        finish = "stop" if ids[-1] == EOS else "length"
        yield NS(outputs=[NS(token_ids=ids, logprobs=[{t: logprob} for t in ids], finish_reason=finish)])

    async def abort(self, request_id: Any) -> None:
        EVENTS.append(("abort",))

    async def sleep(self, level: int) -> None:
        EVENTS.append(("sleep", level))

    async def wake_up(self, tags: list[str]) -> None:
        EVENTS.append(("wake_up", tuple(tags)))

    async def reset_prefix_cache(self) -> bool:
        EVENTS.append(("reset_cache",))
        return True

    async def collective_rpc(self, method: str, args: tuple[Any, ...] = ()) -> list[int]:
        EVENTS.append(("push", len(bucket_from_bytes(args[0]))))
        return [1]


def fake_vllm_module() -> types.ModuleType:
    module = types.ModuleType("vllm")
    module.__spec__ = importlib.machinery.ModuleSpec("vllm", None)  # found by find_spec, as installed
    module.__version__ = "0.11.0"  # type: ignore[attr-defined]
    module.AsyncEngineArgs = FakeEngineArgs  # type: ignore[attr-defined]
    module.AsyncLLMEngine = FakeAsyncLLM  # type: ignore[attr-defined]
    module.SamplingParams = dict  # type: ignore[attr-defined]
    return module


# --- SGLang ---------------------------------------------------------------------------------------


class FakeTokenizerManager:
    model_config = NS(dtype=torch.float32)

    async def generate_request(self, obj: NS, request: Any) -> Any:
        EVENTS.append(("generate",))
        params = obj.sampling_params
        ids = _tokens(params.get("sampling_seed"), obj.input_ids, params["max_new_tokens"])
        finish = "stop" if ids[-1] == EOS else "length"
        yield {
            "meta_info": {"finish_reason": {"type": finish}, "output_token_logprobs": [(-0.5, t, None) for t in ids]}
        }

    def abort_request(self, rid: str = "", abort_all: bool = False) -> None:
        EVENTS.append(("abort",))

    async def release_memory_occupation(self, obj: NS, request: Any) -> None:
        EVENTS.append(("sleep", tuple(obj.tags)))

    async def resume_memory_occupation(self, obj: NS, request: Any) -> None:
        (tag,) = obj.tags
        EVENTS.append(("wake_up", (tag,)))

    async def flush_cache(self) -> NS:
        EVENTS.append(("reset_cache",))
        return NS(success=True)

    async def update_weights_from_tensor(self, obj: NS, request: Any) -> tuple[bool, str]:
        EVENTS.append(("push", len(obj.serialized_named_tensors[0])))
        return True, "ok"


class FakeSGLangEngine:
    """``sglang.Engine``: records its keyword arguments."""

    def __init__(self, **kwargs: Any) -> None:
        EVENTS.append(("sglang.init", dict(kwargs)))
        self.tokenizer_manager = FakeTokenizerManager()
        self.server_args = NS(tp_size=kwargs.get("tp_size", 1))

    def shutdown(self) -> None:
        EVENTS.append(("shutdown",))


def fake_sglang_modules() -> dict[str, types.ModuleType]:
    names = ("sglang", "sglang.srt", "sglang.srt.managers", "sglang.srt.managers.io_struct", "sglang.srt.utils")
    modules = {name: types.ModuleType(name) for name in names}
    for name, module in modules.items():
        module.__spec__ = importlib.machinery.ModuleSpec(name, None)
    io_struct = modules["sglang.srt.managers.io_struct"]
    for request in (
        "GenerateReqInput",
        "ReleaseMemoryOccupationReqInput",
        "ResumeMemoryOccupationReqInput",
        "UpdateWeightsFromTensorReqInput",
    ):
        setattr(io_struct, request, lambda **fields: NS(**fields))
    modules["sglang.srt.managers"].io_struct = io_struct  # type: ignore[attr-defined]
    serializer = NS(serialize=lambda named: [name for name, _ in named])
    modules["sglang.srt.utils"].MultiprocessingSerializer = serializer  # type: ignore[attr-defined]
    modules["sglang"].Engine = FakeSGLangEngine  # type: ignore[attr-defined]
    return modules


def install(monkeypatch: pytest.MonkeyPatch, name: str) -> list[tuple[Any, ...]]:
    """Put the fake ``name`` package (vllm or sglang) into ``sys.modules``; returns the event log."""
    EVENTS.clear()
    modules = {"vllm": fake_vllm_module()} if name == "vllm" else fake_sglang_modules()
    for module_name, module in modules.items():
        monkeypatch.setitem(sys.modules, module_name, module)
    return EVENTS
