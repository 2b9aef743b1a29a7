"""The vLLM / SGLang adapters on a CPU without either package: the missing-package errors, the
pure mappings between the protocol and each engine's documented request / output shapes, and
the adapters' own control flow (abort, pause, sleep, weight updates) against fake engines that
answer like the real ones. Whether the real engines answer so is what the contract suite
checks on a GPU (``scripts/gpu_check.sh``, check 5)."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import sys
from types import SimpleNamespace as NS
from typing import Any

import pytest
import torch
from safetensors.torch import save_file

import hybridflow.utils.optional_engines as optional_engines
from hybridflow.inference.adapters import (
    EngineNotInstalled,
    check_engine_installed,
    engine_available,
    make_adapter,
)
from hybridflow.inference.adapters.common import (
    check_named_tensors,
    served_tensor_shapes,
)
from hybridflow.inference.adapters.sglang import (
    SGLangServer,
    finish_stop_reason,
    sglang_sampling_params,
    sglang_token_output,
)
from hybridflow.inference.adapters.vllm import (
    VLLMServer,
    vllm_sampling_kwargs,
    vllm_token_output,
)
from hybridflow.inference.protocol import InferenceServer, SamplingParams
from hybridflow.inference.weight_transfer import bucket_from_bytes
from hybridflow.inference.weights import WeightsRejected

GREEDY = SamplingParams(temperature=0.0)


def run(coro: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coro, timeout=20))


async def until(condition: Any) -> None:
    """Poll instead of sleeping a fixed time, so a slow machine cannot change the outcome."""
    while not condition():
        await asyncio.sleep(0.005)


# --- the missing-package path --------------------------------------------------------------------


def test_engine_available_uses_find_spec_only(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[str] = []
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: seen.append(name))
    assert not engine_available("vllm") and not engine_available("sglang")
    assert seen == ["vllm", "sglang"] and "vllm" not in sys.modules


@pytest.mark.parametrize("name", ["vllm", "sglang"])
def test_missing_engine_is_a_value_error_naming_the_package(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    monkeypatch.setattr(importlib.util, "find_spec", lambda _: None)
    with pytest.raises(ValueError, match=rf"rollout.name={name} needs the `{name}` package.*rollout.name=torch"):
        check_engine_installed(name)
    with pytest.raises(EngineNotInstalled, match=f"pip install {name}"):
        make_adapter(name, "/nowhere")
    cls = VLLMServer if name == "vllm" else SGLangServer
    with pytest.raises(ValueError, match=f"`{name}` package"):
        cls("/nowhere")


@pytest.mark.parametrize("name", ["vllm", "sglang"])
def test_found_but_broken_package_is_an_import_error(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    monkeypatch.setattr(optional_engines, "engine_available", lambda _: True)
    monkeypatch.setitem(sys.modules, name, None)  # importing it now raises ImportError
    cls = VLLMServer if name == "vllm" else SGLangServer
    with pytest.raises(ImportError, match=f"`{name}` package is installed but failed to import"):
        cls("/nowhere")


def test_other_engines_pass_and_unknown_adapters_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(importlib.util, "find_spec", lambda _: None)
    check_engine_installed("torch")
    check_engine_installed("agent_loop")
    with pytest.raises(ValueError, match="adapters exist for sglang, vllm"):
        make_adapter("torch", "/nowhere")


def test_adapter_modules_import_without_the_engines() -> None:
    assert "vllm" not in sys.modules and "sglang" not in sys.modules
    assert VLLMServer.address is None and SGLangServer.address is None


# --- vLLM mappings --------------------------------------------------------------------------------


def lp(value: float) -> NS:  # vLLM's Logprob
    return NS(logprob=value, rank=None, decoded_token=None)


def test_vllm_sampling_kwargs() -> None:
    kw = vllm_sampling_kwargs(GREEDY, 8)
    assert kw["temperature"] == 0.0 and kw["top_k"] == -1 and kw["top_p"] == 1.0 and kw["n"] == 1
    assert kw["max_tokens"] == 8 and kw["logprobs"] == 0 and kw["prompt_logprobs"] is None and kw["seed"] is None
    kw = vllm_sampling_kwargs(SamplingParams(temperature=0.7, top_k=0, top_p=0.9, seed=5), 0, 3, 0)
    assert (kw["temperature"], kw["top_k"], kw["top_p"], kw["seed"]) == (0.7, -1, 0.9, 5)
    assert kw["max_tokens"] == 1 and kw["logprobs"] == 3 and kw["prompt_logprobs"] == 0
    assert vllm_sampling_kwargs(SamplingParams(top_k=40), 4)["top_k"] == 40
    with pytest.raises(ValueError, match="must be >= 0"):
        vllm_sampling_kwargs(GREEDY, -1)


def vllm_output(ids: list[int], finish: str | None, prompt: list[dict[int, NS] | None] | None = None) -> NS:
    entries = [{t: lp(-0.25 * (i + 1)), 99: lp(-5.0), 98: lp(-0.01)} for i, t in enumerate(ids)]
    return NS(outputs=[NS(token_ids=ids, logprobs=entries, finish_reason=finish)], prompt_logprobs=prompt)


def test_vllm_token_output_one_log_prob_per_token_and_top_k() -> None:
    prompt = [None, {6: lp(-1.0), 50: lp(-0.5)}, {7: lp(-2.0)}]  # the first prompt entry is None
    out = vllm_token_output(vllm_output([11, 12, 2], "stop", prompt), [5, 6, 7], max_tokens=8, logprobs=2,
                            prompt_logprobs=1, weight_version=4)
    assert out.token_ids == [11, 12, 2] and out.stop_reason == "completed" and out.weight_version == 4
    assert out.log_probs == [-0.25, -0.5, -0.75]
    assert out.top_log_probs == [[(98, -0.01), (11, -0.25)], [(98, -0.01), (12, -0.5)], [(98, -0.01), (2, -0.75)]]
    assert out.prompt_log_probs == [-1.0, -2.0]  # one shorter than the prompt
    assert out.prompt_top_log_probs == [[(50, -0.5)], [(7, -2.0)]]


@pytest.mark.parametrize(("finish", "aborted", "stop"), [
    ("stop", False, "completed"), ("length", False, "length"), ("abort", False, "aborted"),
    (None, True, "aborted"), ("stop", True, "completed"), ("abort", True, "aborted"),
])
def test_vllm_finish_reasons(finish: str | None, aborted: bool, stop: str) -> None:
    out = vllm_token_output(vllm_output([3, 4], finish), [1, 2], max_tokens=5, aborted=aborted)
    assert out.stop_reason == stop and len(out.log_probs) == len(out.token_ids) == 2
    assert out.top_log_probs is None and out.prompt_log_probs is None


def test_vllm_token_output_edges() -> None:
    with pytest.raises(RuntimeError, match="unexpected finish_reason None"):
        vllm_token_output(vllm_output([3], None), [1], max_tokens=5)
    # Tokens appended after the output arrived are not read; prompt-only requests drop their token.
    assert vllm_token_output(vllm_output([3, 4, 5], None), [1], max_tokens=9, seen=2, aborted=True).token_ids == [3, 4]
    scored = vllm_token_output(vllm_output([3], "length", [None, {2: lp(-0.7)}]), [1, 2], max_tokens=0,
                               prompt_logprobs=0)
    assert (scored.token_ids, scored.stop_reason, scored.prompt_log_probs) == ([], "length", [-0.7])
    assert vllm_token_output(None, [1], max_tokens=3, aborted=True).stop_reason == "aborted"


# --- SGLang mappings ------------------------------------------------------------------------------


def test_sglang_sampling_params() -> None:
    assert sglang_sampling_params(GREEDY, 6) == {"max_new_tokens": 6, "temperature": 0.0, "top_p": 1.0, "top_k": -1}
    params = sglang_sampling_params(SamplingParams(temperature=1.3, top_k=0, top_p=0.8, seed=9), 0)
    assert params == {"max_new_tokens": 0, "temperature": 1.3, "top_p": 0.8, "top_k": -1, "sampling_seed": 9}
    assert sglang_sampling_params(SamplingParams(top_k=7), 1)["top_k"] == 7


def sglang_out(ids: list[int], kind: str, prompt: list[int] | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "finish_reason": {"type": kind, "matched": 2} if kind else None,
        "output_token_logprobs": [(-0.25 * (i + 1), t, None) for i, t in enumerate(ids)],
        "output_top_logprobs": [[(-0.01, 98, None), (-0.25 * (i + 1), t, None)] for i, t in enumerate(ids)],
    }
    if prompt is not None:
        meta["input_token_logprobs"] = [(None, prompt[0], None)] + [(-1.5, t, None) for t in prompt[1:]]
        meta["input_top_logprobs"] = [None] + [[(-0.5, 50, None), (-1.5, t, None)] for t in prompt[1:]]
    return {"text": "", "output_ids": ids, "meta_info": meta}


def test_sglang_token_output() -> None:
    out = sglang_token_output(sglang_out([11, 2], "stop", [5, 6, 7]), [5, 6, 7], logprobs=1, prompt_logprobs=2,
                              weight_version=2)
    assert out.token_ids == [11, 2] and out.log_probs == [-0.25, -0.5] and out.stop_reason == "completed"
    assert out.top_log_probs == [[(98, -0.01)], [(98, -0.01)]] and out.weight_version == 2
    assert out.prompt_log_probs == [-1.5, -1.5]  # the first prompt token's None entry is dropped
    assert out.prompt_top_log_probs == [[(50, -0.5), (6, -1.5)], [(50, -0.5), (7, -1.5)]]
    plain = sglang_token_output(sglang_out([4], "length"), [1])
    assert plain.top_log_probs is None and plain.prompt_log_probs is None and plain.stop_reason == "length"


@pytest.mark.parametrize(("reason", "aborted", "stop"), [
    ({"type": "stop"}, False, "completed"), ({"type": "length", "length": 4}, False, "length"),
    ({"type": "abort", "message": "x"}, False, "aborted"), ("length", False, "length"),
    (None, True, "aborted"), ({"type": "stop"}, True, "completed"),
])
def test_sglang_finish_reasons(reason: Any, aborted: bool, stop: str) -> None:
    assert finish_stop_reason(reason, aborted) == stop


def test_sglang_unknown_finish_reason_raises() -> None:
    with pytest.raises(RuntimeError, match="unexpected finish_reason"):
        finish_stop_reason(None)


# --- weight-update checks -------------------------------------------------------------------------


@pytest.fixture
def model_dir(tmp_path: Any) -> Any:
    save_file({"model.embed_tokens.weight": torch.zeros(8, 4), "model.norm.weight": torch.ones(4)},
              str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps({"tie_word_embeddings": True}))
    return tmp_path


def test_served_tensor_shapes_adds_the_tied_head(model_dir: Any) -> None:
    assert served_tensor_shapes(model_dir) == {
        "model.embed_tokens.weight": (8, 4), "model.norm.weight": (4,), "lm_head.weight": (8, 4)}
    assert served_tensor_shapes(model_dir / "missing") is None


def test_check_named_tensors(model_dir: Any) -> None:
    shapes = served_tensor_shapes(model_dir)
    good = {"model.norm.weight": torch.ones(4)}
    assert [n for n, _ in check_named_tensors(good, shapes)] == ["model.norm.weight"]
    with pytest.raises(WeightsRejected, match="no tensor named 'model.nope'"):
        check_named_tensors([("model.nope", torch.ones(4))], shapes)
    with pytest.raises(WeightsRejected, match=r"shape \(5,\)"):
        check_named_tensors([("model.norm.weight", torch.ones(5))], shapes)
    with pytest.raises(WeightsRejected, match="NaN or inf"):
        check_named_tensors([("model.norm.weight", torch.tensor([1.0, float("nan"), 0.0, 0.0]))], shapes)
    with pytest.raises(WeightsRejected, match="bfloat16"):  # finite in fp32, inf once served in bf16
        check_named_tensors([("model.norm.weight", torch.full((4,), 1e39, dtype=torch.float64))], shapes,
                            served_dtype=torch.bfloat16)
    with pytest.raises(WeightsRejected, match="missing"):
        check_named_tensors(good, shapes, require_all=True)
    full = {"model.embed_tokens.weight": torch.zeros(8, 4), "model.norm.weight": torch.ones(4)}
    assert len(check_named_tensors(full, shapes, require_all=True)) == 2  # the tied head may be left out


# --- control flow against fake engines ------------------------------------------------------------


class FakeVLLM:
    """Answers like ``AsyncLLMEngine``: cumulative outputs, one token per 10 ms, and no last output
    for an aborted request (the generator just stops)."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.aborted: set[str] = set()
        self.produced: dict[str, int] = {}
        self.model_config = NS(dtype=torch.bfloat16)

    async def generate(self, prompt: dict[str, Any], params: dict[str, Any], request_id: str) -> Any:
        self.calls.append(("generate", request_id, params["temperature"]))
        ids: list[int] = []
        entries: list[dict[int, NS]] = []
        for i in range(params["max_tokens"]):
            await asyncio.sleep(0.01)
            if request_id in self.aborted:
                return
            ids.append(10 + i)
            entries.append({10 + i: lp(-0.5)})
            self.produced[request_id] = len(ids)
            done = i == params["max_tokens"] - 1
            yield NS(outputs=[NS(token_ids=ids, logprobs=entries, finish_reason="length" if done else None)],
                     prompt_logprobs=None)

    async def abort(self, request_id: str | list[str]) -> None:
        self.aborted.update([request_id] if isinstance(request_id, str) else request_id)
        self.calls.append(("abort",))

    async def sleep(self, level: int) -> None:
        self.calls.append(("sleep", level))

    async def wake_up(self, tags: list[str]) -> None:
        self.calls.append(("wake_up", tuple(tags)))

    async def reset_prefix_cache(self) -> bool:
        self.calls.append(("reset_prefix_cache",))
        return True

    async def collective_rpc(self, method: str, args: tuple[Any, ...] = ()) -> list[int]:
        self.calls.append((method, tuple(sorted(bucket_from_bytes(args[0])))))
        return [1]


def names(calls: list[tuple[Any, ...]]) -> list[Any]:
    return [c[0] if c[0] != "wake_up" and c[0] != "sleep" else c for c in calls if c[0] != "generate"]


def test_vllm_server_abort_pause_resume() -> None:
    async def main() -> None:
        engine = FakeVLLM()
        server = VLLMServer("/nowhere", engine=engine)
        assert isinstance(server, InferenceServer)
        running = [asyncio.ensure_future(server.generate(f"t{i}", [1, 2], GREEDY, 1000)) for i in range(2)]
        await until(lambda: len(engine.produced) == 2)
        assert await server.abort_all() == 2
        for out in await asyncio.gather(*running):
            assert out.stop_reason == "aborted" and 0 < len(out.token_ids) == len(out.log_probs) < 1000
        held = asyncio.ensure_future(server.generate("t9", [1], GREEDY, 2))
        await asyncio.sleep(0.1)
        assert not held.done()  # waits, does not fail
        await server.resume_generation()
        out = await held
        assert (out.token_ids, out.stop_reason) == ([10, 11], "length")
        ids = [c[1] for c in engine.calls if c[0] == "generate"]
        assert len(set(ids)) == 3 and all(i.startswith("t") for i in ids) and engine.calls[0][2] == 0.0
        server.shutdown()

    run(main())


def test_vllm_server_serves_callers_on_different_event_loops() -> None:
    server = VLLMServer("/nowhere", engine=FakeVLLM())
    try:
        for _ in range(2):  # e.g. one asyncio.run per test against a module-scoped server
            assert run(server.generate("t", [1], GREEDY, 2)).token_ids == [10, 11]
            assert run(server.abort_all()) == 0
            run(server.resume_generation())
    finally:
        server.shutdown()


def test_vllm_server_caller_cancel_aborts_in_the_engine() -> None:
    async def main() -> None:
        engine = FakeVLLM()
        server = VLLMServer("/nowhere", engine=engine)
        task = asyncio.ensure_future(server.generate("t", [1], GREEDY, 1000))
        await until(lambda: engine.produced)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await until(lambda: ("abort",) in engine.calls and not server._gate.inflight)  # on the engine's loop
        server.shutdown()

    run(main())


def test_vllm_server_sleep_update_wake(model_dir: Any) -> None:
    async def main() -> None:
        engine = FakeVLLM()
        server = VLLMServer(model_dir, engine=engine, bucket_bytes=40)
        await server.sleep(2)
        waiting = asyncio.ensure_future(server.generate("t", [1], GREEDY, 1))
        await server.wake_up(["weights"])
        with pytest.raises(WeightsRejected, match="missing"):  # the weights were freed: all must come
            await server.update_weights([("model.norm.weight", torch.ones(4))], 1)
        full = {"model.embed_tokens.weight": torch.zeros(8, 4), "model.norm.weight": torch.ones(4)}
        assert await server.update_weights(full.items(), 3) == 2
        assert not waiting.done() and await server.get_weight_version() == 3
        await server.wake_up(["kv_cache"])
        assert (await waiting).weight_version == 3
        assert names(engine.calls) == [
            ("sleep", 2), ("wake_up", ("weights",)), "hybridflow_load_bucket", "hybridflow_load_bucket",
            ("wake_up", ("kv_cache",)), "reset_prefix_cache"]
        with pytest.raises(WeightsRejected, match="NaN"):
            await server.update_weights({"model.norm.weight": torch.full((4,), float("nan"))}, 4)
        assert await server.get_weight_version() == 3
        server.shutdown()

    run(main())


class FakeTokenizerManager:
    """Answers like SGLang's ``TokenizerManager``: one result per request, finish reason
    ``abort`` with the tokens so far after ``abort_request``."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.aborted: set[str] = set()
        self.produced: dict[str, int] = {}

    async def generate_request(self, obj: NS, request: Any) -> Any:
        self.calls.append(("generate", obj.rid, obj.sampling_params["temperature"], obj.logprob_start_len))
        entries = []
        kind = "length"
        for i in range(obj.sampling_params["max_new_tokens"]):
            await asyncio.sleep(0.01)
            if obj.rid in self.aborted:
                kind = "abort"
                break
            entries.append((-0.5, 10 + i, None))
            self.produced[obj.rid] = len(entries)
        yield {"output_ids": [t for _, t, _ in entries],
               "meta_info": {"finish_reason": {"type": kind}, "output_token_logprobs": entries}}

    def abort_request(self, rid: str = "", abort_all: bool = False) -> None:
        self.aborted.add(rid)

    async def release_memory_occupation(self, obj: NS, request: Any) -> None:
        self.calls.append(("release", tuple(obj.tags)))

    async def resume_memory_occupation(self, obj: NS, request: Any) -> None:
        self.calls.append(("resume", tuple(obj.tags)))

    async def flush_cache(self) -> NS:
        self.calls.append(("flush",))
        return NS(success=True)

    async def update_weights_from_tensor(self, obj: NS, request: Any) -> tuple[bool, str]:
        self.calls.append(("update", tuple(obj.serialized_named_tensors[0]), obj.flush_cache))
        return True, "ok"


def fake_sglang() -> tuple[NS, NS]:
    tm = FakeTokenizerManager()
    io = NS(**{name: (lambda **kw: NS(**kw)) for name in (
        "GenerateReqInput", "ReleaseMemoryOccupationReqInput", "ResumeMemoryOccupationReqInput",
        "UpdateWeightsFromTensorReqInput")})
    serializer = NS(serialize=lambda named: [n for n, _ in named])
    return NS(tokenizer_manager=tm, server_args=NS(tp_size=1)), NS(io=io, serializer=serializer)


def test_sglang_server_abort_pause_resume() -> None:
    async def main() -> None:
        engine, api = fake_sglang()
        server = SGLangServer("/nowhere", engine=engine, api=api)
        assert isinstance(server, InferenceServer)
        running = [asyncio.ensure_future(server.generate(f"t{i}", [1, 2], GREEDY, 1000)) for i in range(2)]
        await until(lambda: len(engine.tokenizer_manager.produced) == 2)
        assert await server.abort_all() == 2
        for out in await asyncio.gather(*running):
            assert out.stop_reason == "aborted" and 0 < len(out.token_ids) == len(out.log_probs) < 1000
        held = asyncio.ensure_future(server.generate("t9", [1], GREEDY, 2, prompt_logprobs=None))
        await asyncio.sleep(0.1)
        assert not held.done()
        await server.resume_generation()
        assert (await held).token_ids == [10, 11]
        calls = [c for c in engine.tokenizer_manager.calls if c[0] == "generate"]
        assert len({c[1] for c in calls}) == 3 and all(c[2] == 0.0 and c[3] is None for c in calls)
        server.shutdown()

    run(main())


def test_sglang_server_sleep_update_wake(model_dir: Any) -> None:
    async def main() -> None:
        engine, api = fake_sglang()
        server = SGLangServer(model_dir, engine=engine, api=api, bucket_bytes=1 << 20)
        await server.sleep(2)
        waiting = asyncio.ensure_future(server.generate("t", [1], GREEDY, 1))
        await server.wake_up(["weights"])
        full = [("model.embed_tokens.weight", torch.zeros(8, 4)), ("model.norm.weight", torch.ones(4))]
        assert await server.update_weights(full, 5) == 2
        await server.wake_up(["kv_cache"])
        assert (await waiting).weight_version == 5
        assert [c for c in engine.tokenizer_manager.calls if c[0] != "generate"] == [
            ("release", ("kv_cache", "weights")), ("resume", ("weights",)),
            ("update", ("model.embed_tokens.weight", "model.norm.weight"), False),
            ("resume", ("kv_cache",)), ("flush",)]
        await server.clear_kv_cache()
        assert engine.tokenizer_manager.calls[-1] == ("flush",)
        server.shutdown()

    run(main())
