"""The engine thread: weight updates wait for running requests; a failed step does not stop it."""

from __future__ import annotations

import pytest
import torch

from hybridflow.models.tiny import build_tiny_model, build_tiny_tokenizer, save_tiny_model
from hybridflow.server.engine import GenerationEngine
from hybridflow.workers.rollout.continuous import GenRequest
from hybridflow.workers.rollout.generation import generate
from hybridflow.workers.rollout.sampling import SamplingParams
from hybridflow.workers.rollout.torch_rollout import build_decoder

TIMEOUT_S = 60


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture
def engine():
    tokenizer = build_tiny_tokenizer()
    eng = GenerationEngine(build_tiny_model(tokenizer, seed=0), tokenizer.pad_token_id)
    eng.start()
    yield eng, tokenizer
    eng.shutdown()


def _greedy(n_tokens: int) -> SamplingParams:
    return SamplingParams(max_new_tokens=n_tokens, do_sample=False, ignore_eos=True)


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
    with pytest.raises(ValueError, match="is not a folder"):
        eng.update_weights_from_disk(tmp_path / "missing").result(TIMEOUT_S)
    ok = eng.submit(GenRequest((5, 6), _greedy(3)))
    assert len(ok.result(TIMEOUT_S)[0].token_ids) == 3
    assert eng.metrics()["weight_version"] == 0


def test_a_failed_step_fails_the_batch_and_the_engine_keeps_serving(engine):
    eng, _ = engine

    def explode(ids):
        raise RuntimeError("boom")

    doomed = eng.submit(GenRequest((5, 6), _greedy(5), stop_check=explode))
    with pytest.raises(RuntimeError, match="generation failed: boom"):
        doomed.result(TIMEOUT_S)
    fine = eng.submit(GenRequest((5, 6), _greedy(4)))
    assert len(fine.result(TIMEOUT_S)[0].token_ids) == 4
    assert eng.metrics()["running_requests"] == 0


def test_shutdown_fails_what_is_still_queued():
    tokenizer = build_tiny_tokenizer()
    eng = GenerationEngine(build_tiny_model(tokenizer), tokenizer.pad_token_id)  # never started
    pending = eng.submit(GenRequest((5,), _greedy(2)))
    eng.shutdown()
    with pytest.raises(RuntimeError, match="shutting down"):
        pending.result(TIMEOUT_S)
