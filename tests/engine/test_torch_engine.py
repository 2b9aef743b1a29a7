"""TorchEngine: split-invariant gradient accumulation, clipping, skipped steps, lr schedule."""

from __future__ import annotations

import math
from functools import partial

import pytest
import torch

from hybridflow import fields as FK
from hybridflow.algorithms.aggregation import agg_loss
from hybridflow.engine import ENGINES, MicroBatchSpec, TorchEngine
from hybridflow.engine.forward import response_log_probs
from hybridflow.models.tiny import build_tiny_model
from tests.numerics import TINY_DEPTH, TINY_WIDTH, assert_close_across


def _policy_gradient_loss(batch_tokens: torch.Tensor, outputs, micro):
    """−A·ℓ, token-mean with the mini-batch token count (micro-batch shares add up)."""
    mask = micro[FK.RESPONSE_MASK]
    loss = agg_loss(-micro[FK.ADVANTAGES] * outputs["log_probs"], mask, "token-mean", batch_num_tokens=batch_tokens)
    return loss, {"loss": loss.detach()}


def _grads_after(spec: MicroBatchSpec | None, batch) -> tuple[dict[str, torch.Tensor], list]:
    engine = TorchEngine(build_tiny_model(seed=0), lr=1e-3)
    loss_fn = partial(_policy_gradient_loss, batch[FK.RESPONSE_MASK].sum())
    metrics = engine.forward_backward(batch, response_log_probs, loss_fn, spec)
    return {n: p.grad.clone() for n, p in engine.module.named_parameters()}, metrics


@pytest.mark.parametrize("spec", [MicroBatchSpec(size=2), MicroBatchSpec(size=4), MicroBatchSpec(max_token_len=24)])
def test_gradients_do_not_depend_on_the_split(make_rollout_batch, spec) -> None:
    batch = make_rollout_batch(num_rows=8, seed=4).batch
    whole, whole_metrics = _grads_after(MicroBatchSpec(size=8), batch)
    split, split_metrics = _grads_after(spec, batch)
    assert len(split_metrics) > 1
    # a split re-orders the sums over tokens: fp32 tolerance of the tiny model's forward + backward
    total = sum(float(m["loss"]) for m in split_metrics)
    assert_close_across([split, total], [whole, float(whole_metrics[0]["loss"])], dtype=torch.float32,
                        reduction_size=TINY_WIDTH, depth=TINY_DEPTH, what="split vs whole")


def test_optimizer_step_clips_and_reports_pre_clip_norm() -> None:
    model = torch.nn.Linear(2, 1, bias=False)
    with torch.no_grad():
        model.weight.copy_(torch.tensor([[1.0, 1.0]]))
    engine = TorchEngine(model, lr=0.1, grad_clip=1.0, weight_decay=0.0)
    model.weight.grad = torch.tensor([[3.0, 4.0]])
    step = engine.optimizer_step()
    assert step.grad_norm == pytest.approx(5.0) and not step.skipped and step.lr == pytest.approx(0.1)
    # first AdamW step moves each weight by lr·sign(g) (m̂/√v̂ = ±1)
    torch.testing.assert_close(model.weight.detach(), torch.tensor([[0.9, 0.9]]))
    assert model.weight.grad is None


def test_non_finite_gradient_skips_the_step() -> None:
    model = torch.nn.Linear(2, 1, bias=False)
    before = model.weight.detach().clone()
    engine = TorchEngine(model, lr=0.1)
    model.weight.grad = torch.tensor([[float("nan"), 1.0]])
    step = engine.optimizer_step()
    assert step.skipped and math.isnan(step.grad_norm)
    assert torch.equal(model.weight.detach(), before)
    assert engine.optimizer.state == {} or all(not s for s in engine.optimizer.state.values())


@pytest.mark.filterwarnings("ignore:Detected call of `lr_scheduler.step\\(\\)` before:UserWarning")
def test_lr_warmup_and_scheduler_steps() -> None:
    engine = TorchEngine(torch.nn.Linear(2, 1), lr=1.0, warmup_steps=2, scheduler_type="constant")
    lrs = [engine.current_lr()]
    for _ in range(3):
        lrs.append(engine.lr_scheduler_step())
    assert lrs == [0.0, 0.5, 1.0, 1.0]


def test_construction_errors() -> None:
    frozen = torch.nn.Linear(2, 1).requires_grad_(False)
    with pytest.raises(ValueError, match="no trainable parameters"):
        TorchEngine(frozen, lr=1e-3)
    with pytest.raises(ValueError, match="unknown lr scheduler type 'cosine_restarts'"):
        TorchEngine(torch.nn.Linear(2, 1), lr=1e-3, scheduler_type="cosine_restarts")
    with pytest.raises(ValueError, match="exactly one"):
        TorchEngine(torch.nn.Linear(2, 1), lr=1e-3, micro_batch_size=2, max_token_len=64)


def test_registry_and_empty_batch(make_rollout_batch) -> None:
    assert ENGINES.get("torch") is TorchEngine
    assert ENGINES.meta("torch").multi_process is False
    with pytest.raises(ValueError, match="unknown training engine 'megatron'; valid names: .*torch"):
        ENGINES.get("megatron")
    engine = TorchEngine(build_tiny_model(), lr=1e-3)
    empty = make_rollout_batch(num_rows=2).batch[:0]
    with pytest.raises(ValueError, match="empty batch"):
        engine.forward_backward(empty, response_log_probs, lambda o, m: (o["log_probs"].sum(), {}))


def test_bf16_autocast_runs_with_fp32_parameters(make_rollout_batch) -> None:
    engine = TorchEngine(build_tiny_model(), lr=1e-3, autocast_dtype=torch.bfloat16)
    batch = make_rollout_batch(seed=5).batch
    out = engine.infer(batch, response_log_probs)
    assert out["log_probs"].dtype == torch.float32
    fp32 = TorchEngine(build_tiny_model(), lr=1e-3).infer(batch, response_log_probs)
    mask = batch[FK.RESPONSE_MASK].bool()
    assert (out["log_probs"] - fp32["log_probs"])[mask].abs().max() < 0.1
    assert next(engine.module.parameters()).dtype == torch.float32
