"""CriticWorker: values at the right positions, value loss goes down, split invariance."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from hybridflow import fields as FK
from hybridflow.workers.critic import CriticWorker
from tests.numerics import TINY_DEPTH, TINY_WIDTH, assert_close_across


def _critic(cfg) -> CriticWorker:
    worker = CriticWorker(cfg.critic, rollout_n=cfg.actor_rollout_ref.rollout.n)
    worker.init_model()
    return worker


def test_compute_values_shape_and_mask(make_config, make_rollout_batch) -> None:
    critic = _critic(make_config("algorithm.adv_estimator=gae"))
    data = make_rollout_batch(seed=0)
    values = critic.compute_values(data).batch[FK.VALUES]
    assert values.shape == (8, 5)
    assert torch.all(values[data.batch[FK.RESPONSE_MASK] == 0] == 0)
    assert values[data.batch[FK.RESPONSE_MASK] == 1].abs().sum() > 0


def test_update_lowers_the_value_loss(make_config, make_rollout_batch) -> None:
    critic = _critic(make_config("algorithm.adv_estimator=gae", "critic.optim.lr=1e-3"))
    data = make_rollout_batch(seed=1)
    losses = []
    for _ in range(6):
        data.batch[FK.VALUES] = critic.compute_values(data).batch[FK.VALUES]
        losses.append(critic.update_critic(data)["critic/vf_loss"])
    assert losses[-1] < 0.5 * losses[0], losses


def test_metrics_are_split_invariant(make_config, make_rollout_batch) -> None:
    data = make_rollout_batch(seed=2)
    base = ("algorithm.adv_estimator=gae", "critic.cliprange_value=0.05")
    whole = _critic(make_config(*base)).update_critic(data)
    split = _critic(make_config(*base, "critic.ppo_micro_batch_size_per_gpu=2")).update_critic(data)
    tokens = _critic(make_config(*base, "critic.use_dynamic_bsz=true", "critic.ppo_max_token_len_per_gpu=22"))
    tokens = tokens.update_critic(data)
    keys = ("critic/vf_loss", "critic/vf_clipfrac", "critic/grad_norm", "critic/vpred_mean")
    # micro-batch and token-budget splits re-order the sums: fp32 tolerance of the tiny model
    for name, other in (("micro-batches of 2", split), ("token budget", tokens)):
        assert_close_across({k: other[k] for k in keys}, {k: whole[k] for k in keys}, dtype=torch.float32,
                            reduction_size=TINY_WIDTH, depth=TINY_DEPTH, what=name)
    assert 0 < whole["critic/vf_clipfrac"] < 1
    assert whole["critic/lr"] == pytest.approx(1e-5)


def test_missing_returns_and_unresolved_config(make_config, make_rollout_batch) -> None:
    cfg = make_config("algorithm.adv_estimator=gae")
    critic = _critic(cfg)
    data = make_rollout_batch()
    data.pop(batch_keys=[FK.RETURNS])
    with pytest.raises(KeyError, match=r"update_critic needs batch fields \['returns'\]"):
        critic.update_critic(data)
    raw = dataclasses.replace(cfg.critic, ppo_epochs=None)
    with pytest.raises(ValueError, match=r"critic config keys \['ppo_epochs'\] are unresolved"):
        CriticWorker(raw, rollout_n=2)
