"""FSDPEngine in one process (a one-rank gloo group): same numbers as TorchEngine, mixed
precision, a value head, LoRA weights for the rollout, and the error without a process group."""

from __future__ import annotations

from functools import partial

import pytest
import torch
import torch.distributed as dist
from peft import LoraConfig, get_peft_model
from torch.distributed.tensor import DTensor

from hybridflow import fields as FK
from hybridflow.algorithms.aggregation import agg_loss
from hybridflow.engine import ENGINES, FSDPEngine, MicroBatchSpec, TorchEngine
from hybridflow.engine.forward import response_log_probs, response_values
from hybridflow.models import ValueHeadModel
from hybridflow.models.tiny import build_tiny_model
from tests.numerics import TINY_DEPTH, TINY_WIDTH, assert_close_across


def _pg_loss(batch_tokens: torch.Tensor, outputs, micro):
    mask = micro[FK.RESPONSE_MASK]
    loss = agg_loss(-micro[FK.ADVANTAGES] * outputs["log_probs"], mask, "token-mean", batch_num_tokens=batch_tokens)
    return loss, {"loss": loss.detach()}


def _step(engine, batch) -> tuple[float, list]:
    loss_fn = partial(_pg_loss, batch[FK.RESPONSE_MASK].sum())
    metrics = engine.forward_backward(batch, response_log_probs, loss_fn, MicroBatchSpec(size=3))
    return engine.optimizer_step().grad_norm, metrics


def test_registered_as_multi_process_engine() -> None:
    assert ENGINES.get("fsdp") is FSDPEngine and ENGINES.meta("fsdp").multi_process


def test_needs_a_process_group(monkeypatch) -> None:
    monkeypatch.setattr(dist, "is_initialized", lambda: False)  # whatever other tests left behind
    with pytest.raises(RuntimeError, match="call Worker.init_process_group"):
        FSDPEngine(torch.nn.Linear(2, 2), lr=1e-3)


def test_one_rank_fsdp_matches_the_torch_engine(one_rank_group, make_rollout_batch) -> None:
    batch = make_rollout_batch(num_rows=8, seed=3).batch
    plain = TorchEngine(build_tiny_model(seed=0), lr=1e-3, grad_clip=0.5)
    sharded = FSDPEngine(build_tiny_model(seed=0), lr=1e-3, grad_clip=0.5)
    assert sharded.shards_parameters and not plain.shards_parameters and sharded.num_blocks == 2
    assert all(isinstance(p, DTensor) for p in sharded.module.parameters())
    # another backend (DTensor ops, a sharded norm): fp32 tolerance of the tiny model, step by step
    for step in range(1, 3):
        norm_plain, metrics_plain = _step(plain, batch)
        norm_sharded, metrics_sharded = _step(sharded, batch)
        assert norm_plain > 0.5  # clipping was active
        assert_close_across([norm_sharded, [float(m["loss"]) for m in metrics_sharded]],
                            [norm_plain, [float(m["loss"]) for m in metrics_plain]], dtype=torch.float32,
                            reduction_size=TINY_WIDTH, depth=step * TINY_DEPTH, what=f"step {step}")
    expected = dict(plain.iter_sync_weights())
    synced = dict(sharded.iter_sync_weights())
    assert synced.keys() == expected.keys()  # tied lm_head yielded once, as for the torch engine
    assert not any(isinstance(t, DTensor) for t in synced.values())
    assert_close_across(synced, expected, dtype=torch.float32, reduction_size=TINY_WIDTH, depth=2 * TINY_DEPTH,
                        what="weights after two steps")


def test_bf16_policy_keeps_fp32_master_weights_and_fp32_value_head(one_rank_group, make_rollout_batch) -> None:
    batch = make_rollout_batch(num_rows=4, seed=1).batch
    policy = FSDPEngine(build_tiny_model(seed=0), lr=1e-3, autocast_dtype=torch.bfloat16)
    fp32 = TorchEngine(build_tiny_model(seed=0), lr=1e-3)
    low = policy.infer(batch, response_log_probs)["log_probs"]
    full = fp32.infer(batch, response_log_probs)["log_probs"]
    assert low.dtype == torch.float32
    torch.testing.assert_close(low, full, rtol=0, atol=0.05)  # bf16 compute, same model
    assert not torch.equal(low, full)  # ... and it really ran in bf16
    _step(policy, batch)
    assert all(p.dtype == torch.float32 for p in policy.module.parameters())

    backbone = build_tiny_model(seed=0).model
    critic = FSDPEngine(ValueHeadModel(backbone, 128, init_std=0.02), lr=1e-3, autocast_dtype=torch.bfloat16)
    mask = batch[FK.RESPONSE_MASK]

    def value_loss(outputs, micro):
        loss = agg_loss((outputs["values"] - micro[FK.RETURNS]) ** 2, micro[FK.RESPONSE_MASK], "token-mean",
                        batch_num_tokens=mask.sum())
        return loss, {}

    critic.forward_backward(batch, response_values, value_loss)
    assert critic.optimizer_step().grad_norm > 0


def test_lora_weights_are_gathered_and_merged(one_rank_group) -> None:
    def lora_model():
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)  # peft draws lora_A from the global RNG
            model = get_peft_model(build_tiny_model(seed=0), LoraConfig(r=4, lora_alpha=8, target_modules="all-linear"))
        with torch.no_grad():
            for name, p in model.named_parameters():
                if "lora_B" in name:
                    p.normal_(0, 0.1, generator=torch.Generator().manual_seed(len(name)))
        return model

    expected = dict(TorchEngine(lora_model(), lr=1e-3).iter_sync_weights())
    sharded = FSDPEngine(lora_model(), lr=1e-3)
    synced = dict(sharded.iter_sync_weights())
    assert synced.keys() == expected.keys() and not any(".lora_" in n for n in synced)
    for name, tensor in expected.items():
        torch.testing.assert_close(synced[name], tensor, rtol=0, atol=1e-6, msg=name)
