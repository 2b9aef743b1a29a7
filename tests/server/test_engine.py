"""The engine thread: weight updates wait for running requests; failures stay with the requests
they belong to (one request, or the batch of a failed forward); cancellation; the thread lives on."""

from __future__ import annotations

import threading

import pytest
import torch

from hybridflow.inference.batcher_types import GenRequest
from hybridflow.inference.decoders import build_decoder
from hybridflow.inference.engine_queue import GenerationFailed, RequestCancelled
from hybridflow.inference.generation import generate
from hybridflow.inference.generation_engine import GenerationEngine
from hybridflow.inference.sampling import GenerationParams, NonFiniteLogitsError
from hybridflow.inference.weights import WeightsRejected
from hybridflow.models.tiny import (
    build_tiny_model,
    build_tiny_tokenizer,
    save_tiny_model,
)

TIMEOUT_S = 60


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture
def engine():
    tokenizer = build_tiny_tokenizer()
    eng = GenerationEngine(build_tiny_model(tokenizer, seed=0), tokenizer.pad_token_id)
    eng.start()
    yield eng, tokenizer
    eng.shutdown()


def _greedy(n_tokens: int) -> GenerationParams:
    return GenerationParams(max_new_tokens=n_tokens, do_sample=False, ignore_eos=True)


def _alone(model, prompt: list[int], n_tokens: int) -> list[int]:
    ids = torch.tensor([prompt])
    mask = torch.ones_like(ids)
    return generate(build_decoder(model), ids, mask, mask.cumsum(1) - 1, _greedy(n_tokens), 0).responses[0].tolist()


def test_a_weight_update_waits_for_running_requests(engine, tmp_path):
    eng, tokenizer = engine
    prompt = tokenizer("Hi")["input_ids"]  # seed 0 and seed 3 answer it differently
    folder = save_tiny_model(tmp_path / "seed3", tokenizer, seed=3)
    running = eng.submit(GenRequest(tuple(prompt), _greedy(40)))
    update = eng.update_weights_from_disk(folder)
    after = eng.submit(GenRequest(tuple(prompt), _greedy(6)))
    old = _alone(build_tiny_model(tokenizer, seed=0), prompt, 40)
    new = _alone(build_tiny_model(tokenizer, seed=3), prompt, 6)
    assert old[:6] != new
    assert running.result(TIMEOUT_S)[0].token_ids == old  # finished on the weights it started with
    assert update.result(TIMEOUT_S) > 0
    assert after.result(TIMEOUT_S)[0].token_ids == new
    assert eng.metrics()["weight_version"] == 1


def test_a_bad_update_fails_alone(engine, tmp_path):
    eng, tokenizer = engine
    with pytest.raises(WeightsRejected, match="is not a folder of"):
        eng.update_weights_from_disk(tmp_path / "missing").result(TIMEOUT_S)
    ok = eng.submit(GenRequest((5, 6), _greedy(3)))
    assert len(ok.result(TIMEOUT_S)[0].token_ids) == 3
    assert eng.metrics()["weight_version"] == 0


def test_a_request_that_fails_alone_does_not_stop_the_others(engine):
    eng, _ = engine

    def explode(ids):
        raise RuntimeError("boom")

    doomed = eng.submit(GenRequest((5, 6), _greedy(5), stop_check=explode))
    neighbour = eng.submit(GenRequest((5, 7), _greedy(6)))
    with pytest.raises(RuntimeError, match="^boom$"):
        doomed.result(TIMEOUT_S)
    assert len(neighbour.result(TIMEOUT_S)[0].token_ids) == 6
    metrics = eng.metrics()
    assert metrics["requests_failed"] == 1 and metrics["running_requests"] == 0 and metrics["engine_alive"]


def test_a_failed_forward_fails_its_batch_and_the_engine_keeps_serving(engine, monkeypatch):
    eng, _ = engine
    real_decode = eng.decoder.decode
    calls = []

    def decode_once_broken(tokens, positions):
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("kernel exploded")
        return real_decode(tokens, positions)

    monkeypatch.setattr(eng.decoder, "decode", decode_once_broken)
    with pytest.raises(GenerationFailed, match="generation failed: kernel exploded"):
        eng.submit(GenRequest((5, 6), _greedy(5))).result(TIMEOUT_S)
    assert len(eng.submit(GenRequest((5, 6), _greedy(4))).result(TIMEOUT_S)[0].token_ids) == 4
    assert eng.metrics()["running_requests"] == 0


def test_a_model_with_nan_weights_fails_each_request_with_a_clear_error():
    tokenizer = build_tiny_tokenizer()
    model = build_tiny_model(tokenizer, seed=0)
    with torch.no_grad():
        model.model.layers[0].mlp.down_proj.weight.fill_(float("nan"))
    eng = GenerationEngine(model, tokenizer.pad_token_id)
    eng.start()
    try:
        for params in (_greedy(3), GenerationParams(max_new_tokens=3, temperature=0.7, top_p=0.9)):
            with pytest.raises(NonFiniteLogitsError, match="non-finite logits .* the model is broken"):
                eng.submit(GenRequest((5, 6), params)).result(TIMEOUT_S)
        assert eng.metrics()["engine_alive"] and eng.metrics()["requests_failed"] == 2
    finally:
        eng.shutdown()


def test_cancel_stops_a_running_request_at_the_next_step(engine):
    eng, _ = engine
    reached, release = threading.Event(), threading.Event()

    def hold_at_third_token(ids):  # runs on the engine thread, inside its step
        if len(ids) == 3:
            reached.set()
            release.wait(TIMEOUT_S)
        return False

    future = eng.submit(GenRequest((5, 6), _greedy(200), stop_check=hold_at_third_token))
    assert reached.wait(TIMEOUT_S)
    eng.cancel(future)  # queued while the engine is mid-step
    release.set()
    with pytest.raises(RequestCancelled):
        future.result(TIMEOUT_S)
    assert len(eng.submit(GenRequest((5, 6), _greedy(2))).result(TIMEOUT_S)[0].token_ids) == 2
    metrics = eng.metrics()
    assert metrics["requests_cancelled"] == 1 and metrics["tokens_generated"] == 3 + 2


def test_shutdown_fails_what_is_still_queued():
    tokenizer = build_tiny_tokenizer()
    eng = GenerationEngine(build_tiny_model(tokenizer), tokenizer.pad_token_id)  # never started
    pending = eng.submit(GenRequest((5,), _greedy(2)))
    eng.shutdown()
    with pytest.raises(RuntimeError, match="shutting down"):
        pending.result(TIMEOUT_S)
