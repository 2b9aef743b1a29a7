"""Token clients on the built-in engine: the in-process client returns the sampler's own tokens
and log-probs, concurrent trajectories share forwards, stop reasons and weight versions are
reported, and the HTTP client against a real server on loopback answers the same."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import pytest
import torch

from hybridflow.inference.client import (
    HttpClient,
    InferenceRequestError,
    InProcessClient,
)
from hybridflow.inference.decoders import build_decoder
from hybridflow.inference.generation import generate
from hybridflow.inference.generation_engine import GenerationEngine
from hybridflow.inference.protocol import SamplingParams, TokenClient
from hybridflow.inference.sampling import GenerationParams
from hybridflow.models.tiny import (
    build_tiny_model,
    build_tiny_tokenizer,
    save_tiny_model,
)
from tests.numerics import TINY_DEPTH, TINY_WIDTH, assert_close_across
from tests.serving import serve_in_thread

pytestmark = pytest.mark.usefixtures("one_torch_thread")
TIMEOUT_S = 60
GREEDY = SamplingParams(temperature=0.0)
PROMPTS = [[5, 6, 7], [11, 12, 13, 14, 15], [20, 21], [30, 31, 32, 33]]


@pytest.fixture(scope="module")
def tokenizer():
    return build_tiny_tokenizer()


@pytest.fixture
def engine(tokenizer) -> Iterator[GenerationEngine]:
    # A short batch window lets a burst of submissions start as one prefill; the assertions
    # below hold without it too (late requests join the running batch), it only keeps them fast.
    eng = GenerationEngine(build_tiny_model(tokenizer, seed=0), tokenizer.pad_token_id, batch_window_s=0.05)
    eng.start()
    yield eng
    eng.shutdown()


def _plain(model, prompt: list[int], max_tokens: int, stop: tuple[int, ...] = ()) -> tuple[list[int], list[float]]:
    """The closed-batch sampler on ``prompt`` alone, greedy: (token ids, log-probs)."""
    ids = torch.tensor([prompt])
    mask = torch.ones_like(ids)
    params = GenerationParams(max_new_tokens=max_tokens, do_sample=False, stop_token_ids=stop)
    out = generate(build_decoder(model), ids, mask, mask.cumsum(1) - 1, params, 0)
    n = int(out.lengths[0])
    return out.responses[0, :n].tolist(), out.log_probs[0, :n].tolist()


def test_clients_satisfy_the_protocol(engine):
    assert isinstance(InProcessClient(engine), TokenClient)
    assert isinstance(HttpClient("http://127.0.0.1:1"), TokenClient)


def test_greedy_in_process_equals_the_plain_sampler_tokens_and_log_probs(engine):
    client = InProcessClient(engine, stop_token_ids=())
    out = asyncio.run(client.generate("traj-0", PROMPTS[0], GREEDY, 12))
    ids, log_probs = _plain(engine.model, PROMPTS[0], 12)
    assert out.token_ids == ids
    assert len(out.log_probs) == len(out.token_ids) == 12
    assert out.log_probs == pytest.approx(log_probs, abs=1e-5)
    assert out.stop_reason == "length" and out.weight_version == 0


def test_stop_token_gives_completed_and_keeps_the_stop_token(engine):
    free, _ = _plain(engine.model, PROMPTS[1], 10)
    index = max(free.index(t) for t in set(free))  # the latest first occurrence (0 if greedy repeats one id)
    stop = free[index]
    out = asyncio.run(InProcessClient(engine, stop_token_ids=[stop]).generate("t", PROMPTS[1], GREEDY, 10))
    assert out.token_ids == free[: index + 1] and out.stop_reason == "completed"
    assert len(out.log_probs) == index + 1
    assert out.token_ids == _plain(engine.model, PROMPTS[1], 10, (stop,))[0]


def test_default_stop_ids_are_the_models_eos(engine, tokenizer):
    assert InProcessClient(engine).stop_token_ids == (tokenizer.eos_token_id,)


def test_no_budget_left_generates_nothing(engine):
    out = asyncio.run(InProcessClient(engine).generate("t", PROMPTS[0], GREEDY, 0))
    assert out.token_ids == [] and out.stop_reason == "length"
    assert engine.metrics()["forwards"] == 0


def test_concurrent_trajectories_share_engine_forwards(engine):
    client = InProcessClient(engine, stop_token_ids=())

    async def many():
        return await asyncio.gather(*(client.generate(f"traj-{i}", p, GREEDY, 16) for i, p in enumerate(PROMPTS)))

    outs = asyncio.run(many())
    metrics = engine.metrics()
    assert metrics["requests_finished"] == len(PROMPTS)
    assert metrics["max_requests_per_forward"] == len(PROMPTS)  # all four in one forward at least once
    assert metrics["forwards"] < len(PROMPTS) * 16  # fewer forwards than four runs one after another
    assert [o.token_ids for o in outs] == [_plain(engine.model, p, 16)[0] for p in PROMPTS]


def test_sampled_requests_with_a_seed_repeat(engine):
    client = InProcessClient(engine, stop_token_ids=())
    sampling = SamplingParams(temperature=1.0, top_k=20, top_p=0.9, seed=7)
    first = asyncio.run(client.generate("a", PROMPTS[2], sampling, 8))
    again = asyncio.run(client.generate("b", PROMPTS[2], sampling, 8))
    assert first.token_ids == again.token_ids and first.log_probs == again.log_probs
    assert all(lp <= 0 for lp in first.log_probs)


def test_weight_version_counts_updates(engine, tokenizer, tmp_path):
    client = InProcessClient(engine, stop_token_ids=())
    before = asyncio.run(client.generate("t", PROMPTS[0], GREEDY, 6))
    folder = save_tiny_model(tmp_path / "seed3", tokenizer, seed=3)
    assert engine.update_weights_from_disk(folder).result(TIMEOUT_S) > 0
    after = asyncio.run(client.generate("t", PROMPTS[0], GREEDY, 6))
    assert (before.weight_version, after.weight_version) == (0, 1)
    assert after.token_ids == _plain(build_tiny_model(tokenizer, seed=3), PROMPTS[0], 6)[0]


def test_shutdown_aborts_waiting_requests(tokenizer):
    eng = GenerationEngine(build_tiny_model(tokenizer, seed=0), tokenizer.pad_token_id)  # never started

    async def run():
        task = asyncio.ensure_future(InProcessClient(eng).generate("t", PROMPTS[0], GREEDY, 8))
        await asyncio.sleep(0)  # the request is queued
        eng.shutdown()
        return await task

    out = asyncio.run(run())
    assert out.token_ids == [] and out.log_probs == [] and out.stop_reason == "aborted"


def test_cancelling_the_caller_cancels_the_request(engine):
    client = InProcessClient(engine, stop_token_ids=())

    async def run():
        task = asyncio.ensure_future(client.generate("t", PROMPTS[0], GREEDY, 500))
        while engine.metrics()["running_requests"] == 0:
            await asyncio.sleep(0.005)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(run())
    deadline = time.monotonic() + TIMEOUT_S
    while engine.metrics()["requests_cancelled"] == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert engine.metrics()["requests_cancelled"] == 1 and engine.metrics()["running_requests"] == 0


# ---- HTTP against a real server on loopback ------------------------------------------------------


@pytest.fixture
def served(tokenizer) -> Iterator[tuple[str, GenerationEngine]]:
    """``build_app`` under uvicorn in a thread of this process: (base URL, the app's engine)."""
    pytest.importorskip("fastapi")
    from hybridflow.server.app import build_app
    from hybridflow.server.state import ServerState
    from hybridflow.server.text import TextCodec

    engine = GenerationEngine(build_tiny_model(tokenizer, seed=0), tokenizer.pad_token_id)
    state = ServerState(engine=engine, codec=TextCodec(tokenizer), model_name="tiny", max_model_len=1024,
                        eos_token_ids=(tokenizer.eos_token_id,), api_key="k")
    with serve_in_thread(build_app(state)) as url:
        yield url, engine


def test_http_client_equals_the_in_process_client_under_greedy(served, tokenizer):
    base_url, engine = served
    http = HttpClient(base_url + "/", api_key="k")
    local = InProcessClient(engine)  # the app's own engine, default stops = the server's EOS

    async def both():
        remote = await asyncio.gather(*(http.generate(f"t{i}", p, GREEDY, 10) for i, p in enumerate(PROMPTS)))
        here = await asyncio.gather(*(local.generate(f"t{i}", p, GREEDY, 10) for i, p in enumerate(PROMPTS)))
        return remote, here

    try:
        remote, here = asyncio.run(both())
    finally:
        http.close()
    assert [r.token_ids for r in remote] == [h.token_ids for h in here]
    # the server batches the requests its own way (other shapes, other kernels): fp32 tolerance
    assert_close_across([r.log_probs for r in remote], [h.log_probs for h in here], dtype=torch.float32,
                        reduction_size=TINY_WIDTH, depth=TINY_DEPTH // 2, what="log-probs")
    for r, h in zip(remote, here, strict=True):
        assert (r.stop_reason, r.weight_version) == (h.stop_reason, 0)
        assert len(r.log_probs) == len(r.token_ids)


def test_http_client_reports_server_errors(served):
    base_url, _ = served
    http = HttpClient(base_url, api_key="wrong")
    try:
        with pytest.raises(InferenceRequestError, match="401"):
            asyncio.run(http.generate("t", PROMPTS[0], GREEDY, 4))
        http.api_key = "k"
        with pytest.raises(InferenceRequestError, match="outside the vocabulary"):
            asyncio.run(http.generate("t", [10**6], GREEDY, 4))
    finally:
        http.close()


def test_http_body_maps_the_protocol_sampling():
    body = HttpClient("http://x", stop_token_ids=[3]).body([1, 2], SamplingParams(0.7, 0.9, 5, seed=4), 9)
    assert body == {"input_ids": [1, 2], "sampling_params": {
        "max_new_tokens": 9, "temperature": 0.7, "top_p": 0.9, "top_k": 5, "n": 1, "stop_token_ids": [3], "seed": 4}}


def test_for_request_gives_each_request_its_own_reproducible_seed():
    from hybridflow.inference.protocol import SamplingParams

    base = SamplingParams(temperature=1.0, seed=7)
    assert base.for_request(3).seed == base.for_request(3).seed  # reproducible
    seeds = {base.for_request(i, t).seed for i in range(20) for t in range(5)}
    assert len(seeds) == 100  # no two (row, turn) pairs share a stream
    assert all(0 <= s < 2**63 for s in seeds)
    assert SamplingParams(seed=8).for_request(3).seed != base.for_request(3).seed
    assert base.for_request(1).temperature == 1.0
    unseeded = SamplingParams(temperature=0.5)
    assert unseeded.for_request(4) is unseeded
