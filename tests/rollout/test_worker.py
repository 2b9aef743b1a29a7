"""The rollout role colocated with the real actor (shared module) and on its own (pushed weights)."""

from __future__ import annotations

import pytest
import torch

from hybridflow import fields as F
from hybridflow.config import load_config
from hybridflow.protocol import DataProto
from hybridflow.workers.actor import ActorWorker
from hybridflow.workers.rollout import actor_logprob_diff
from hybridflow.workers.rollout.worker import RolloutWorker
from hybridflow.workers.shared_policy import withdraw_policy


def _load(tiny_model_dir, dtype: str):
    return load_config(
        None,
        [
            f"actor_rollout_ref.model.path={tiny_model_dir}",
            f"actor_rollout_ref.model.dtype={dtype}",
            "actor_rollout_ref.rollout.n=2",
            "actor_rollout_ref.rollout.response_length=6",
            "actor_rollout_ref.rollout.temperature=0.8",
            "actor_rollout_ref.actor.ppo_mini_batch_size=2",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
            "actor_rollout_ref.actor.optim.lr=0.05",
        ],
    )


@pytest.fixture
def config(tiny_model_dir):
    return _load(tiny_model_dir, "fp32")


@pytest.fixture
def share_name():
    name = "rollout-tests"
    yield name
    withdraw_policy(name, 0)


def _prompts(encode, seed: int) -> DataProto:
    return DataProto.from_dict(tensors=encode(), meta_info={"seed": seed, "eos_token_id": []})


def test_colocated_rollout_agrees_with_actor_before_and_after_an_update(config, encode, share_name):
    actor = ActorWorker(config.actor_rollout_ref, share_name=share_name)
    actor.init_model()
    rollout = RolloutWorker(config.actor_rollout_ref, share_name=share_name)
    rollout.init_model()
    assert rollout.shares_actor_module and rollout.rollout.model is actor.module
    for step in range(2):
        batch = rollout.generate_sequences(_prompts(encode, seed=step)).data
        old = actor.compute_log_prob(batch).batch[F.OLD_LOG_PROBS]
        diff = actor_logprob_diff(batch.batch[F.ROLLOUT_LOG_PROBS], old, batch.batch[F.RESPONSE_MASK])
        assert diff["rollout/actor_logprob_diff"] < 1e-5, (step, diff)
        batch.batch[F.OLD_LOG_PROBS] = old
        batch.batch[F.ADVANTAGES] = torch.randn(old.shape, generator=torch.Generator().manual_seed(step))
        actor.update_actor(batch)
        rollout.update_weights()  # sharing the module: a no-op, the next step sees the update


def test_colocated_bf16_rollout_samples_from_a_bf16_copy_of_the_fp32_actor(tiny_model_dir, encode, share_name):
    config = _load(tiny_model_dir, "bf16")
    actor = ActorWorker(config.actor_rollout_ref, share_name=share_name)
    actor.init_model()
    rollout = RolloutWorker(config.actor_rollout_ref, share_name=share_name)
    rollout.init_model()
    assert next(actor.module.parameters()).dtype == torch.float32
    assert rollout.rollout.decoder.dtype == torch.bfloat16
    batch = rollout.generate_sequences(_prompts(encode, seed=0)).data
    old = actor.compute_log_prob(batch).batch[F.OLD_LOG_PROBS]  # bf16 autocast on the actor side
    diff = actor_logprob_diff(batch.batch[F.ROLLOUT_LOG_PROBS], old, batch.batch[F.RESPONSE_MASK])
    assert 0 < diff["rollout/actor_logprob_diff"] < 0.05  # bf16 rounding on both sides, not exact


def test_separate_rollout_loads_its_own_model_and_takes_pushed_weights(config, encode, share_name):
    actor = ActorWorker(config.actor_rollout_ref, share_name=share_name)
    actor.init_model()
    rollout = RolloutWorker(config.actor_rollout_ref, share_name=None)
    rollout.init_model()
    assert not rollout.shares_actor_module and rollout.rollout.model is not actor.module
    with torch.no_grad():
        for p in actor.module.parameters():
            p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(1)) * 0.05)
    stale = rollout.generate_sequences(_prompts(encode, seed=0)).data
    old = actor.compute_log_prob(stale).batch[F.OLD_LOG_PROBS]
    mask = stale.batch[F.RESPONSE_MASK]
    assert actor_logprob_diff(stale.batch[F.ROLLOUT_LOG_PROBS], old, mask)["rollout/actor_logprob_diff"] > 1e-3
    rollout.update_weights(actor.engine.iter_sync_weights())
    fresh = rollout.generate_sequences(_prompts(encode, seed=0)).data
    old = actor.compute_log_prob(fresh).batch[F.OLD_LOG_PROBS]
    diff = actor_logprob_diff(fresh.batch[F.ROLLOUT_LOG_PROBS], old, fresh.batch[F.RESPONSE_MASK])
    assert diff["rollout/actor_logprob_diff"] < 1e-5
    with pytest.raises(ValueError, match="no colocated actor"):
        rollout.update_weights()
    rollout.release()
    rollout.resume()
    again = rollout.generate_sequences(_prompts(encode, seed=0)).data
    assert torch.equal(again.batch[F.RESPONSES], fresh.batch[F.RESPONSES])


def test_unknown_rollout_name_is_a_clear_error(tiny_model_dir):
    config = load_config(
        None, [f"actor_rollout_ref.model.path={tiny_model_dir}", "actor_rollout_ref.rollout.name=vllm_typo"]
    )
    worker = RolloutWorker(config.actor_rollout_ref, share_name=None)
    with pytest.raises(ValueError, match="unknown rollout 'vllm_typo'; valid names: .*torch"):
        worker.init_model()


def test_sleep_frees_the_built_in_engines_packed_weights_and_cache(tiny_model_dir, encode):
    """The built-in sampler keeps its KV cache and packed weights between generations; the
    trainer's ``sleep`` (colocated, free_cache_engine) frees them, and the next generation
    rebuilds them (``wake_up`` has nothing to restore)."""
    config = load_config(
        None,
        [
            f"actor_rollout_ref.model.path={tiny_model_dir}",
            "actor_rollout_ref.model.dtype=fp32",
            "actor_rollout_ref.rollout.response_length=6",
        ],
    )
    rollout = RolloutWorker(config.actor_rollout_ref, share_name=None)
    rollout.init_model()
    decoder = rollout.rollout.decoder
    first = rollout.generate_sequences(_prompts(encode, seed=3)).data
    assert decoder.cache is not None and all(p._packed_weight is not None for p in decoder.projections())
    rollout.sleep()
    assert decoder.cache is None and not any(p._packed_weight is not None for p in decoder.projections())
    rollout.wake_up(["weights"])
    rollout.wake_up(["kv_cache"])
    assert decoder.cache is None  # nothing restored eagerly
    again = rollout.generate_sequences(_prompts(encode, seed=3)).data
    assert torch.equal(first.batch[F.RESPONSES], again.batch[F.RESPONSES])
