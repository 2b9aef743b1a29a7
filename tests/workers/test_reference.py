"""ReferenceWorker: frozen initial policy; with LoRA, the actor's module with adapters disabled."""

from __future__ import annotations

import pytest
import torch

from hybridflow import fields as FK
from hybridflow.workers.actor import ActorWorker
from hybridflow.workers.reference import ReferenceWorker
from hybridflow.workers.shared_policy import withdraw_policy


def test_reference_stays_at_the_initial_policy(make_config, make_rollout_batch) -> None:
    cfg = make_config()
    actor = ActorWorker(cfg.actor_rollout_ref, share_name=None)
    actor.init_model()
    ref = ReferenceWorker(cfg.actor_rollout_ref, share_name=None)
    ref.init_model()
    assert not ref.shares_actor_module
    data = make_rollout_batch(seed=0)
    initial = actor.compute_log_prob(data).batch[FK.OLD_LOG_PROBS]
    ref_before = ref.compute_ref_log_prob(data).batch[FK.REF_LOG_PROB]
    assert torch.equal(ref_before, initial)  # same weights, same code path: KL starts at exactly 0
    actor.update_actor(data)
    assert torch.equal(ref.compute_ref_log_prob(data).batch[FK.REF_LOG_PROB], ref_before)
    assert not torch.equal(actor.compute_log_prob(data).batch[FK.OLD_LOG_PROBS], initial)


def test_lora_reference_is_the_actor_without_adapters(make_config, make_rollout_batch) -> None:
    cfg = make_config("actor_rollout_ref.model.lora_rank=4", "actor_rollout_ref.actor.optim.lr=1e-2")
    actor = ActorWorker(cfg.actor_rollout_ref, share_name="lora-test")
    actor.init_model()
    try:
        ref = ReferenceWorker(cfg.actor_rollout_ref, share_name="lora-test")
        ref.init_model()
        assert ref.shares_actor_module
        data = make_rollout_batch(seed=1)
        base = ref.compute_ref_log_prob(data).batch[FK.REF_LOG_PROB]
        for _ in range(2):
            actor.update_actor(data)
        after = ref.compute_ref_log_prob(data).batch[FK.REF_LOG_PROB]
        # a separately loaded base model (no LoRA) gives the same log-probs
        plain = ReferenceWorker(make_config().actor_rollout_ref, share_name=None)
        plain.init_model()
        expected = plain.compute_ref_log_prob(data).batch[FK.REF_LOG_PROB]
        torch.testing.assert_close(after, expected, rtol=0, atol=1e-6)
        torch.testing.assert_close(base, expected, rtol=0, atol=1e-6)
        moved = actor.compute_log_prob(data).batch[FK.OLD_LOG_PROBS]
        assert (moved - after).abs().max() > 1e-3  # the adapters did change the actor
        # and the adapters are switched back on after the reference pass
        assert torch.equal(actor.compute_log_prob(data).batch[FK.OLD_LOG_PROBS], moved)
    finally:
        withdraw_policy("lora-test", 0)


def test_lora_reference_without_a_published_actor_is_a_clear_error(make_config) -> None:
    ref = ReferenceWorker(make_config("actor_rollout_ref.model.lora_rank=4").actor_rollout_ref, share_name="nobody")
    with pytest.raises(LookupError, match="colocate the actor role before this role"):
        ref.init_model()


def test_uninitialised_reference(make_config, make_rollout_batch) -> None:
    ref = ReferenceWorker(make_config().actor_rollout_ref)
    with pytest.raises(RuntimeError, match="init_model"):
        ref.compute_ref_log_prob(make_rollout_batch())
