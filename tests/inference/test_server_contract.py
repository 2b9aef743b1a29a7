"""The inference-server contract, run against every engine that imports.

Always: the built-in engine in this process (``InProcessClient``) and over HTTP
(``HttpClient`` against the FastAPI app under uvicorn on loopback). On a GPU machine with vLLM
or SGLang installed, ``HYBRIDFLOW_CONTRACT_ENGINES=vllm,sglang`` adds their adapters
(``hybridflow.inference.adapters.make_adapter``) on the same tiny Llama folder, so the same
assertions cover them (``scripts/gpu_check.sh`` runs this). Log-prob checks use a tolerance
that fits the engine's precision (fp32 here; bf16 kernels on a GPU).
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import torch

from hybridflow.inference.generation_engine import GenerationEngine
from hybridflow.inference.partial_rollout import PartialRolloutClient
from hybridflow.inference.prompt_scoring import prompt_log_probs
from hybridflow.inference.protocol import InferenceServer, SamplingParams
from hybridflow.models.tiny import (
    build_tiny_model,
    build_tiny_tokenizer,
    save_tiny_model,
)
from tests.serving import serve_in_thread

pytestmark = pytest.mark.usefixtures("one_torch_thread")
TIMEOUT_S = 120
GREEDY = SamplingParams(temperature=0.0)
PROMPT = [5, 6, 7, 8, 9]
LONG = 600  # new tokens of a generation that is still running when the test acts on it
EXTRA_ENGINES = [e for e in os.environ.get("HYBRIDFLOW_CONTRACT_ENGINES", "").split(",") if e]


@dataclass
class Served:
    server: Any  # an InferenceServer
    reference: torch.nn.Module  # the same weights in HF form, fp32, for log-prob checks
    other: dict[str, torch.Tensor]  # another model's weights (a real update)
    original: dict[str, torch.Tensor]
    atol: float
    close: Any
    progress: Any = None  # () -> tokens generated so far, where the engine can tell


async def _when_running(served: Served, task: asyncio.Task, tokens: int = 8) -> None:
    """Return once a started generation has produced a few tokens (it must not have finished)."""
    if served.progress is None:
        await asyncio.sleep(0.3)
    else:
        start, deadline = served.progress(), time.monotonic() + TIMEOUT_S
        while served.progress() < start + tokens and not task.done() and time.monotonic() < deadline:
            await asyncio.sleep(0.002)
    assert not task.done(), "the long generation finished before the test acted on it"


def _state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _builtin(tokenizer, over_http: bool) -> Served:
    from hybridflow.inference.client import HttpClient, InProcessClient

    model = build_tiny_model(tokenizer, seed=0)
    reference = build_tiny_model(tokenizer, seed=0).eval()
    other = _state(build_tiny_model(tokenizer, seed=1))
    engine = GenerationEngine(model, tokenizer.pad_token_id, owns_weights=True)
    progress = lambda: engine.batcher.stats.tokens_generated  # noqa: E731
    if not over_http:
        engine.start()
        return Served(InProcessClient(engine), reference, other, _state(reference), 1e-4, engine.shutdown, progress)
    from hybridflow.server.app import build_app
    from hybridflow.server.state import ServerState
    from hybridflow.server.text import TextCodec

    state = ServerState(engine=engine, codec=TextCodec(tokenizer), model_name="tiny", max_model_len=1024,
                        eos_token_ids=(tokenizer.eos_token_id,), api_key="k", control_routes=True)
    serving = serve_in_thread(build_app(state))
    url = serving.__enter__()
    # Small buckets: the tiny model's update crosses several requests, the embedding alone.
    client = HttpClient(url, api_key="k", weight_bucket_bytes=64 * 1024)

    def close() -> None:
        client.close()
        serving.__exit__(None, None, None)

    return Served(client, reference, other, _state(reference), 1e-4, close, progress)


def _adapter(name: str, tokenizer, folder) -> Served:
    from hybridflow.inference.adapters import make_adapter

    model = build_tiny_model(tokenizer, seed=0)
    save_tiny_model(model, tokenizer, folder)
    server = make_adapter(name, str(folder), dtype="bfloat16")  # GPU attention kernels want half precision
    close = getattr(server, "close", None) or getattr(server, "shutdown", None) or (lambda: None)
    other = _state(build_tiny_model(tokenizer, seed=1))
    return Served(server, model.eval(), other, _state(model), 5e-2, close)


@pytest.fixture(scope="module")
def tokenizer():
    return build_tiny_tokenizer()


@pytest.fixture(params=["builtin", "builtin-http", *EXTRA_ENGINES])
def served(request, tokenizer, tmp_path) -> Iterator[Served]:
    if request.param == "builtin":
        s = _builtin(tokenizer, over_http=False)
    elif request.param == "builtin-http":
        s = _builtin(tokenizer, over_http=True)
    else:
        s = _adapter(request.param, tokenizer, tmp_path / "model")
    try:
        yield s
    finally:
        s.close()


def run(coro: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coro, TIMEOUT_S))


def test_implements_the_protocol(served):
    assert isinstance(served.server, InferenceServer)


def test_greedy_generation_is_repeatable_with_one_log_prob_per_token(served):
    async def go():
        a = await served.server.generate("a", PROMPT, GREEDY, 12)
        b = await served.server.generate("b", PROMPT, GREEDY, 12)
        return a, b

    a, b = run(go())
    assert a.token_ids == b.token_ids and 0 < len(a.token_ids) <= 12
    assert len(a.log_probs) == len(a.token_ids)
    assert a.stop_reason in ("completed", "length") and a.first_weight_version == a.weight_version
    assert all(lp <= 0 for lp in a.log_probs)


def test_top_log_probs_put_the_greedy_token_first(served):
    out = run(served.server.generate("t", PROMPT, GREEDY, 6, logprobs=3))
    assert len(out.top_log_probs) == len(out.token_ids)
    for token, lp, top in zip(out.token_ids, out.log_probs, out.top_log_probs, strict=True):
        assert len(top) == 3 and top[0][0] == token
        assert abs(top[0][1] - lp) < served.atol
        assert top[0][1] >= top[1][1] >= top[2][1]


def test_prompt_log_probs_equal_a_forward_of_the_model(served):
    expected, expected_top = prompt_log_probs(served.reference, PROMPT, 2)
    out = run(served.server.generate("p", PROMPT, GREEDY, 1, prompt_logprobs=2))
    assert len(out.prompt_log_probs) == len(PROMPT) - 1
    assert out.prompt_log_probs == pytest.approx(expected, abs=served.atol)
    assert [[i for i, _ in row] for row in out.prompt_top_log_probs] == [[i for i, _ in row] for row in expected_top]
    scored = run(served.server.generate("s", PROMPT, GREEDY, 0, prompt_logprobs=0))
    assert scored.token_ids == [] and scored.prompt_log_probs == pytest.approx(expected, abs=served.atol)


def test_abort_all_returns_partial_tokens_holds_new_requests_until_resume(served):
    server = served.server

    async def go():
        full = await server.generate("u", PROMPT, GREEDY, LONG)
        running = asyncio.create_task(server.generate("r", PROMPT, GREEDY, LONG))
        await _when_running(served, running)
        aborted = await server.abort_all()
        partial = await running
        held = asyncio.create_task(server.generate("h", PROMPT, GREEDY, 4))
        await asyncio.sleep(0.3)
        held_while_paused = not held.done()
        await server.resume_generation()
        return full, aborted, partial, held_while_paused, await held

    full, aborted, partial, held_while_paused, after = run(go())
    assert full.stop_reason == "length", "the test prompt must not stop early"
    assert aborted >= 1
    assert partial.stop_reason == "aborted"
    assert 0 < len(partial.token_ids) < LONG and len(partial.log_probs) == len(partial.token_ids)
    assert partial.token_ids == full.token_ids[: len(partial.token_ids)]
    assert held_while_paused
    assert after.stop_reason in ("completed", "length") and after.token_ids == full.token_ids[:4]


def test_partial_rollout_resumes_to_the_uninterrupted_greedy_tokens(served):
    server = served.server
    client = PartialRolloutClient(server)

    async def go():
        full = await server.generate("u", PROMPT, GREEDY, LONG)
        task = asyncio.create_task(client.generate("r", PROMPT, GREEDY, LONG))
        await _when_running(served, task)
        await server.abort_all()
        await asyncio.sleep(0.1)
        await server.resume_generation()
        return full, await task

    full, joined = run(go())
    assert client.resumes == 1
    assert joined.stop_reason == "length" and joined.token_ids == full.token_ids
    assert len(joined.log_probs) == LONG
    assert joined.log_probs == pytest.approx(full.log_probs, abs=max(served.atol, 1e-3))


def test_update_weights_swaps_atomically_and_stamps_the_version(served):
    server = served.server

    async def go():
        before = await server.generate("a", PROMPT, GREEDY, 16)
        copied = await server.update_weights(served.other.items(), version=7)
        updated = await server.generate("b", PROMPT, GREEDY, 16)
        version = await server.get_weight_version()
        await server.update_weights(served.original.items(), version=8)
        restored = await server.generate("c", PROMPT, GREEDY, 16)
        return before, copied, updated, version, restored

    before, copied, updated, version, restored = run(go())
    assert copied >= len(served.other) - 1  # a tied head may be one tensor
    assert version == 7 and updated.weight_version == 7 and restored.weight_version == 8
    assert updated.token_ids != before.token_ids
    assert restored.token_ids == before.token_ids and restored.log_probs == pytest.approx(before.log_probs, abs=served.atol)


def test_a_failed_update_leaves_the_old_weights_serving(served):
    server = served.server
    name, tensor = next(iter(served.other.items()))
    bad_shape = [(name, tensor), ("model.norm.weight", torch.ones(3))]
    unknown = [("no.such.tensor", torch.zeros(2))]
    non_finite = [(name, torch.full_like(tensor, float("nan")))]

    async def go():
        before = await server.generate("a", PROMPT, GREEDY, 16)
        errors = []
        for pairs in (bad_shape, unknown, non_finite):
            try:
                await server.update_weights(pairs, version=99)
            except Exception as err:  # noqa: BLE001 - each engine words its own error
                errors.append(str(err))
        after = await server.generate("b", PROMPT, GREEDY, 16)
        return before, errors, after, await server.get_weight_version()

    before, errors, after, version = run(go())
    assert len(errors) == 3
    assert "model.norm.weight" in errors[0] and "no.such.tensor" in errors[1]
    assert after.token_ids == before.token_ids and version == before.weight_version != 99


def test_an_update_during_generation_drains_first(served):
    server = served.server

    async def go():
        start = await server.get_weight_version()
        running = asyncio.create_task(server.generate("r", PROMPT, GREEDY, LONG))
        await _when_running(served, running)
        await server.update_weights(served.other.items(), version=start + 1)
        return start, await running

    start, out = run(go())
    assert out.stop_reason == "length" and len(out.token_ids) == LONG  # not cut short
    assert out.weight_version == out.first_weight_version == start  # no response mixes versions


def test_sleep_and_wake_keep_the_answers(served):
    server = served.server

    async def go():
        before = await server.generate("a", PROMPT, GREEDY, 16)
        await server.sleep(1)
        held = asyncio.create_task(server.generate("h", PROMPT, GREEDY, 16))
        await asyncio.sleep(0.3)
        held_while_asleep = not held.done()
        await server.wake_up()
        after_level1 = await held
        await server.clear_kv_cache()
        cleared = await server.generate("c", PROMPT, GREEDY, 16)
        # verl's sequence around a level-2 sleep: wake the weights, push them, wake the cache.
        await server.sleep(2)
        await server.wake_up(["weights"])
        await server.update_weights(served.original.items(), version=3)
        await server.wake_up(["kv_cache"])
        after_level2 = await server.generate("b", PROMPT, GREEDY, 16)
        return before, held_while_asleep, after_level1, cleared, after_level2

    before, held_while_asleep, *afters = run(go())
    assert held_while_asleep
    for after in afters:
        assert after.token_ids == before.token_ids
        assert after.log_probs == pytest.approx(before.log_probs, abs=served.atol)
    assert afters[-1].weight_version == 3
