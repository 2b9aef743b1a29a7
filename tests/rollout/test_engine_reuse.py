"""The agent-loop rollout keeps one generation engine for its life (issue 35): built on first use
on the rollout's own decoder, weights re-packed only when they change, the plain path and the
engine taking turns on the shared decoder, and the engine thread stopped by ``close``."""

from __future__ import annotations

import threading
from dataclasses import replace

import torch

from hybridflow import fields as F
from hybridflow.config import load_config
from hybridflow.config.actor_rollout_ref import RolloutConfig
from hybridflow.protocol import DataProto
from hybridflow.workers.rollout.agent_loop import AgentLoopRollout
from hybridflow.workers.rollout.worker import RolloutWorker


def _rollout(model, tokenizer, **settings) -> AgentLoopRollout:
    base = RolloutConfig()
    config = replace(base, response_length=6, seed=0, do_sample=False, **settings)
    config = replace(config, multi_turn=replace(base.multi_turn, enable=True))
    return AgentLoopRollout(config, model, tokenizer, dtype=torch.float32)


def _batch(encode, **meta) -> DataProto:
    return DataProto.from_dict(tensors=encode(), meta_info={"eos_token_id": [], **meta})


def _engine_threads() -> int:
    return sum(t.name == "hybridflow-engine" and t.is_alive() for t in threading.enumerate())


def test_one_engine_and_one_packing_across_calls(tiny_llama, tokenizer, encode) -> None:
    threads = _engine_threads()
    rollout = _rollout(tiny_llama, tokenizer)
    repacked: list[int] = []
    refresh = rollout.decoder.refresh_weights
    rollout.decoder.refresh_weights = lambda: repacked.append(refresh()) or repacked[-1]  # type: ignore[method-assign]
    first = rollout.generate_sequences(_batch(encode))
    engine = rollout.engines.engine
    for _ in range(2):
        again = rollout.generate_sequences(_batch(encode))
        assert torch.equal(again.batch[F.RESPONSES], first.batch[F.RESPONSES])
    assert rollout.engines.engines_built == 1 and rollout.engines.engine is engine
    assert engine.decoder is rollout.decoder  # the plain sampler's packed weights, shared
    assert repacked[0] > 0 and set(repacked[1:]) == {0}  # packed once; unchanged weights are not re-packed
    assert _engine_threads() == threads + 1
    rollout.close()
    assert _engine_threads() == threads and not engine.alive


def test_new_weights_are_repacked_and_sampled(tiny_qwen2, tokenizer, encode) -> None:
    model = tiny_qwen2
    saved = {k: v.clone() for k, v in model.state_dict().items()}
    rollout = _rollout(model, tokenizer)
    before = rollout.generate_sequences(_batch(encode))
    try:
        generator = torch.Generator().manual_seed(0)
        moved = {k: v + 0.5 * torch.randn(v.shape, generator=generator) for k, v in saved.items() if v.dim() == 2}
        rollout.update_weights(moved)
        after = rollout.generate_sequences(_batch(encode))
        fresh = _rollout(model, tokenizer)  # a fresh engine on the new weights
        expected = fresh.generate_sequences(_batch(encode))
        fresh.close()
    finally:
        model.load_state_dict(saved)
        rollout.weights_changed()
    assert rollout.engines.engines_built == 1
    assert not torch.equal(after.batch[F.RESPONSES], before.batch[F.RESPONSES])
    assert torch.equal(after.batch[F.RESPONSES], expected.batch[F.RESPONSES])
    rollout.close()


def test_plain_path_and_engine_share_the_decoder_in_turn(tiny_llama, tokenizer, encode) -> None:
    rollout = _rollout(tiny_llama, tokenizer)
    agent = rollout.generate_sequences(_batch(encode))
    rollout.enabled = False  # the same rollout, plain path: the decoder the engine steps
    plain = rollout.generate_sequences(_batch(encode))
    rollout.enabled = True
    again = rollout.generate_sequences(_batch(encode))
    assert torch.equal(plain.batch[F.RESPONSES], agent.batch[F.RESPONSES])
    assert torch.equal(again.batch[F.RESPONSES], agent.batch[F.RESPONSES])
    assert rollout.engines.engines_built == 1
    rollout.close()
    rollout.generate_sequences(_batch(encode))  # after close, a later call starts a fresh engine
    assert rollout.engines.engines_built == 2
    rollout.close()


def test_the_worker_closes_its_rollouts_engine(tiny_model_dir, tokenizer, encode) -> None:
    threads = _engine_threads()
    config = load_config(
        None,
        [
            f"actor_rollout_ref.model.path={tiny_model_dir}",
            "actor_rollout_ref.model.dtype=fp32",
            "actor_rollout_ref.rollout.response_length=4",
            "actor_rollout_ref.rollout.multi_turn.enable=true",
        ],
    )
    worker = RolloutWorker(config.actor_rollout_ref, share_name=None)
    worker.init_model()
    worker.generate_sequences(_batch(encode))
    assert _engine_threads() == threads + 1
    worker.close()
    assert _engine_threads() == threads
