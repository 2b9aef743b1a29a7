"""ActorWorker: log-probs, verl update semantics, split invariance, learning signal, checkpoints."""

from __future__ import annotations

import pytest
import torch

from hybridflow import fields as FK
from hybridflow.algorithms.utils import masked_mean
from hybridflow.workers.actor import ActorWorker
from hybridflow.workers.shared_policy import withdraw_policy
from tests.numerics import TINY_DEPTH, TINY_WIDTH, assert_close_across


def _actor(cfg) -> ActorWorker:
    worker = ActorWorker(cfg.actor_rollout_ref, share_name=None)
    worker.init_model()
    return worker


def _grads_of_first_step(worker: ActorWorker, data, monkeypatch) -> dict[str, torch.Tensor]:
    """Run update_actor and capture the accumulated gradients right before the first step."""
    captured: dict[str, torch.Tensor] = {}
    real_step = worker.engine.optimizer_step

    def capture_then_step():
        if not captured:
            captured.update({n: p.grad.clone() for n, p in worker.module.named_parameters() if p.grad is not None})
        return real_step()

    monkeypatch.setattr(worker.engine, "optimizer_step", capture_then_step)
    worker.update_actor(data)
    return captured


def test_compute_log_prob_matches_a_direct_forward(make_config, make_rollout_batch) -> None:
    worker = _actor(make_config("actor_rollout_ref.rollout.temperature=0.5"))
    data = make_rollout_batch(seed=0)
    out = worker.compute_log_prob(data)
    assert out.meta_info["temperature"] == 0.5
    b = data.batch
    with torch.no_grad():
        logits = worker.module(input_ids=b[FK.INPUT_IDS], attention_mask=b[FK.ATTENTION_MASK],
                               position_ids=b[FK.POSITION_IDS]).logits[:, -6:-1] / 0.5
    expected = torch.log_softmax(logits, -1).gather(-1, b[FK.RESPONSES].unsqueeze(-1)).squeeze(-1)
    torch.testing.assert_close(out.batch[FK.OLD_LOG_PROBS], expected * b[FK.RESPONSE_MASK], rtol=0, atol=1e-5)
    assert out.batch[FK.ENTROPYS].shape == (8, 5)
    assert (out.batch[FK.ENTROPYS][b[FK.RESPONSE_MASK] == 1] > 0).all()


def test_sum_pi_squared_is_an_explicit_option_of_compute_log_prob(make_config, make_rollout_batch) -> None:
    worker = _actor(make_config("actor_rollout_ref.rollout.temperature=0.5"))
    data = make_rollout_batch(seed=0)
    assert FK.SUM_PI_SQUARED not in worker.compute_log_prob(data).batch.keys()
    out = worker.compute_log_prob(data, calculate_sum_pi_squared=True)
    assert "calculate_sum_pi_squared" not in data.meta_info and "calculate_sum_pi_squared" not in out.meta_info
    b = data.batch
    with torch.no_grad():
        logits = worker.module(input_ids=b[FK.INPUT_IDS], attention_mask=b[FK.ATTENTION_MASK],
                               position_ids=b[FK.POSITION_IDS]).logits[:, -6:-1] / 0.5
    expected = torch.softmax(logits, -1).square().sum(-1) * b[FK.RESPONSE_MASK]
    torch.testing.assert_close(out.batch[FK.SUM_PI_SQUARED], expected, rtol=0, atol=1e-5)


MICRO_4 = ("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",)  # 2 × 4 instead of 1 × 8


@pytest.mark.parametrize(
    "split, agg",
    [
        (MICRO_4, "token-mean"),
        (("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1",), "token-mean"),
        (("actor_rollout_ref.actor.use_dynamic_bsz=true", "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=22"),
         "token-mean"),
        (MICRO_4, "seq-mean-token-mean"),
        (MICRO_4, "seq-mean-token-sum-norm"),
    ],
)
def test_update_gradients_do_not_depend_on_the_micro_batch_split(make_config, make_rollout_batch, monkeypatch, split, agg):
    extra = (f"actor_rollout_ref.actor.loss_agg_mode={agg}", "actor_rollout_ref.actor.entropy_coeff=0.01")
    data = make_rollout_batch(seed=1)
    data.union(_actor(make_config(*extra)).compute_log_prob(data).select(batch_keys=[FK.OLD_LOG_PROBS]))
    whole = _grads_of_first_step(_actor(make_config(*extra)), data, monkeypatch)
    parts = _grads_of_first_step(_actor(make_config(*extra, *split)), data, monkeypatch)
    assert whole
    # a split re-orders the sums over tokens: fp32 tolerance of the tiny model's forward + backward
    assert_close_across(parts, whole, dtype=torch.float32, reduction_size=TINY_WIDTH, depth=TINY_DEPTH,
                        what="gradients")


def test_update_metrics_have_verl_names_and_split_invariant_values(make_config, make_rollout_batch) -> None:
    data = make_rollout_batch(seed=2)
    overrides = ("actor_rollout_ref.actor.entropy_coeff=0.01", "actor_rollout_ref.actor.use_kl_loss=true")
    data.union(_actor(make_config(*overrides)).compute_log_prob(data).select(batch_keys=[FK.OLD_LOG_PROBS]))
    data.batch[FK.REF_LOG_PROB] = data.batch[FK.OLD_LOG_PROBS] - 0.1 * data.batch[FK.RESPONSE_MASK]
    whole = _actor(make_config(*overrides)).update_actor(data)
    split = _actor(make_config(*overrides, "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2")).update_actor(data)
    keys = ("actor/pg_loss", "actor/pg_clipfrac", "actor/ppo_kl", "actor/entropy", "actor/kl_loss",
            "actor/grad_norm", "actor/lr", "actor/pg_clipfrac_lower")
    # a micro-batch split re-orders the sums over tokens (and the kernels under them): fp32 tolerance
    # of the tiny model's widest sum (its MLP, 256) through its forward and backward passes
    assert_close_across({k: split[k] for k in keys}, {k: whole[k] for k in keys}, dtype=torch.float32,
                        reduction_size=TINY_WIDTH, depth=TINY_DEPTH, what="split vs whole")
    assert whole["actor/lr"] == pytest.approx(1e-3)
    assert whole["actor/ppo_kl"] == pytest.approx(0.0, abs=1e-6)  # first step: ℓ = ℓ_old
    # low_var_kl of d = ℓ_ref − ℓ = −0.1 on every valid token: e^d − d − 1
    assert whole["actor/kl_loss"] == pytest.approx(torch.tensor(-0.1).exp().item() + 0.1 - 1, abs=1e-6)


def test_on_policy_shortcut_equals_stored_old_log_probs(make_config, make_rollout_batch, monkeypatch) -> None:
    cfg = make_config()
    data = make_rollout_batch(seed=3)
    worker = _actor(cfg)
    assert worker.needs_old_log_probs(8) is False
    shortcut = _grads_of_first_step(worker, data, monkeypatch)
    stored = make_rollout_batch(seed=3)
    stored.union(_actor(cfg).compute_log_prob(stored).select(batch_keys=[FK.OLD_LOG_PROBS]))
    with_old = _grads_of_first_step(_actor(cfg), stored, monkeypatch)
    for name, grad in shortcut.items():
        torch.testing.assert_close(with_old[name], grad, rtol=0, atol=1e-6, msg=name)


def test_several_steps_need_old_log_probs(make_config, make_rollout_batch) -> None:
    worker = _actor(make_config("actor_rollout_ref.actor.ppo_epochs=2"))
    assert worker.needs_old_log_probs(8)
    with pytest.raises(KeyError, match=r"update_actor needs batch fields \['old_log_probs'\]"):
        worker.update_actor(make_rollout_batch(seed=4))


def test_mini_batches_and_epochs_count_optimizer_steps(make_config, make_rollout_batch, monkeypatch) -> None:
    # 16 rows, mini-batch = 2 prompts × n=2 = 4 rows → 4 steps per epoch, 2 epochs → 8 steps
    worker = _actor(make_config("actor_rollout_ref.actor.ppo_mini_batch_size=2", "actor_rollout_ref.actor.ppo_epochs=2",
                                "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
                                "actor_rollout_ref.actor.shuffle=true"))
    data = make_rollout_batch(num_rows=16, seed=5)
    data.union(worker.compute_log_prob(data).select(batch_keys=[FK.OLD_LOG_PROBS]))
    steps = []
    real_step = worker.engine.optimizer_step
    monkeypatch.setattr(worker.engine, "optimizer_step", lambda: steps.append(1) or real_step())
    metrics = worker.update_actor(data)
    assert len(steps) == 8
    assert metrics["actor/ppo_kl"] != 0.0  # later steps see a moved policy


def test_batch_not_divisible_into_mini_batches(make_config, make_rollout_batch) -> None:
    worker = _actor(make_config())
    data = make_rollout_batch(num_rows=12)
    data.union(worker.compute_log_prob(data).select(batch_keys=[FK.OLD_LOG_PROBS]))
    with pytest.raises(ValueError, match="batch of 12 rows cannot be split into mini-batches of 8 rows"):
        worker.update_actor(data)


def test_policy_gradient_raises_probability_of_rewarded_responses(make_config, make_rollout_batch) -> None:
    worker = _actor(make_config("actor_rollout_ref.actor.optim.lr=3e-3"))
    data = make_rollout_batch(seed=6)
    mask = data.batch[FK.RESPONSE_MASK]
    sign = torch.tensor([1.0, -1.0] * 4).unsqueeze(1)  # even rows rewarded, odd rows punished
    data.batch[FK.ADVANTAGES] = sign * mask
    before = worker.compute_log_prob(data).batch[FK.OLD_LOG_PROBS]
    for _ in range(5):
        worker.update_actor(data)
    after = worker.compute_log_prob(data).batch[FK.OLD_LOG_PROBS]
    gain = masked_mean(after - before, mask, axis=1)
    assert (gain[0::2] > 0.5).all(), gain
    assert (gain[1::2] < -0.5).all(), gain


def test_checkpoint_round_trip_restores_bit_identical_outputs(make_config, make_rollout_batch, tmp_path) -> None:
    cfg = make_config()
    data = make_rollout_batch(seed=7)
    worker = _actor(cfg)
    worker.update_actor(data)
    worker.save_checkpoint(str(tmp_path / "actor"))
    worker.update_actor(data)
    expected = worker.compute_log_prob(data).batch[FK.OLD_LOG_PROBS]
    resumed = _actor(cfg)
    resumed.load_checkpoint(str(tmp_path / "actor"))
    resumed.update_actor(data)
    assert torch.equal(resumed.compute_log_prob(data).batch[FK.OLD_LOG_PROBS], expected)
    assert (tmp_path / "actor" / "tokenizer" / "tokenizer.json").is_file()


def test_module_is_the_live_engine_module_and_is_published(make_config) -> None:
    from hybridflow.workers.shared_policy import lookup_policy

    worker = ActorWorker(make_config().actor_rollout_ref, share_name="test-actor")
    with pytest.raises(RuntimeError, match="init_model"):
        _ = worker.module
    worker.init_model()
    try:
        shared = lookup_policy("test-actor", 0)
        assert shared.module is worker.module is worker.engine.module and not shared.is_lora
    finally:
        withdraw_policy("test-actor", 0)
    with pytest.raises(LookupError, match="no actor policy shared as 'test-actor' for rank 0"):
        lookup_policy("test-actor", 0)


def test_empty_batch_is_rejected(make_config, make_rollout_batch) -> None:
    worker = _actor(make_config())
    with pytest.raises(ValueError, match="non-empty tensor batch"):
        worker.compute_log_prob(make_rollout_batch()[:0])
