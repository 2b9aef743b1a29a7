"""Prompts repeated across rows run once per batch, with the same outputs and gradients as one pass per row."""

from __future__ import annotations

from functools import partial

import pytest
import torch

from hybridflow import fields as FK
from hybridflow.engine import MicroBatchSpec
from hybridflow.engine.forward import compute_position_ids, response_log_probs
from hybridflow.engine.micro_batch import plan_prompt_chunks
from hybridflow.engine.micro_batch_runner import (
    infer_micro_batches,
    make_plan,
    plan_chunks,
    train_chunks,
)
from hybridflow.engine.shared_prompt import (
    PromptCache,
    distinct_prompts,
    prompt_groups,
    shares_prompts,
    takes_prompt_cache,
)
from hybridflow.models.loader import apply_lora, enable_gradient_checkpointing
from hybridflow.models.tiny import build_tiny_model

CPU = torch.device("cpu")


def _grouped_batch(make_rollout_batch, groups: int = 3, n: int = 4, seed: int = 0, prompt_len: int = 7):
    """A rollout batch whose rows come in runs of ``n`` that repeat one prompt (as GRPO's do),
    responses still different per row; the first prompt is ``prompt_len`` tokens long."""
    batch = make_rollout_batch(num_rows=groups * n, prompt_len=prompt_len, response_len=6, seed=seed).batch.clone()
    source = torch.arange(groups).repeat_interleave(n) * n  # every row takes its group's first prompt
    batch[FK.PROMPTS] = batch[FK.PROMPTS][source]
    ids, mask = batch[FK.INPUT_IDS].clone(), batch[FK.ATTENTION_MASK].clone()
    ids[:, :prompt_len], mask[:, :prompt_len] = ids[source, :prompt_len], mask[source, :prompt_len]
    # The first prompt fills all prompt_len columns, the others are left-padded.
    ids[:n, :prompt_len] = torch.randint(4, 500, (prompt_len,), generator=torch.Generator().manual_seed(seed))
    mask[:n, :prompt_len] = 1
    batch[FK.INPUT_IDS], batch[FK.ATTENTION_MASK] = ids, mask
    batch[FK.POSITION_IDS] = compute_position_ids(mask)
    return batch


def _unshared(module, micro, **kwargs):
    """``response_log_probs`` without a ``prompt_cache`` parameter: every row runs its own prompt."""
    return response_log_probs(module, micro, **kwargs)


def test_distinct_prompts_by_hand() -> None:
    ids = torch.tensor([[0, 5, 6], [7, 8, 9], [0, 5, 6], [0, 0, 6], [7, 8, 9]])
    mask = (ids != 0).long()
    first, which = distinct_prompts(ids, mask, compute_position_ids(mask))
    assert first.tolist() == [0, 1, 3]
    assert which.tolist() == [0, 1, 0, 2, 1]
    # Same tokens, other positions: a different prompt.
    positions = compute_position_ids(mask)
    positions[2] += 1
    first, which = distinct_prompts(ids, mask, positions)
    assert which.tolist() == [0, 1, 2, 3, 1]


def test_cache_only_when_rows_repeat_a_prompt(make_rollout_batch) -> None:
    model = build_tiny_model(seed=0)
    distinct = make_rollout_batch(num_rows=6, seed=3).batch
    grouped = _grouped_batch(make_rollout_batch)
    assert prompt_groups(distinct) is None
    prompt_of, width = prompt_groups(grouped)
    assert prompt_of == [0] * 4 + [1] * 4 + [2] * 4 and width == 6
    with torch.no_grad():
        assert PromptCache.build(model, distinct, list(range(6)), CPU) is None
        assert PromptCache.build(model, grouped, [0, 4, 8], CPU) is None  # one row of each prompt
        cache = PromptCache.build(model, grouped, [4, 5, 8, 9, 10], CPU)
    assert cache is not None
    assert cache.which.tolist() == [-1] * 4 + [0, 0, -1, -1, 1, 1, 1, -1]
    with pytest.raises(ValueError, match="outside"):
        cache.for_rows(torch.tensor([0]), cache.start)


def test_prompt_chunks_by_hand() -> None:
    lengths = [10, 12, 9, 20, 18, 5, 6, 7]
    prompt_of = [0, 0, 0, 1, 1, 2, 2, 2]
    # Budget 2 rows × 20 tokens = 40 prompt tokens = 2 prompts of 16 per chunk; prompts by longest row: 1, 0, 2.
    chunks = plan_prompt_chunks(lengths, prompt_of, 16, MicroBatchSpec(size=2))
    assert chunks == [[[3, 4], [1, 0], [2]], [[7, 6], [5]]]
    assert plan_prompt_chunks(lengths, prompt_of, 16, None) == [[list(range(8))]]
    assert plan_prompt_chunks(lengths, prompt_of, 100, MicroBatchSpec(max_token_len=40)) == [
        [[3, 4]], [[1, 0, 2]], [[7, 6, 5]]
    ]  # a prompt wider than the budget still makes a chunk of its own


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize(
    "spec", [None, MicroBatchSpec(size=1), MicroBatchSpec(size=3), MicroBatchSpec(max_token_len=30)]
)
def test_log_probs_equal_one_pass_per_row(make_rollout_batch, arch, spec) -> None:
    model = build_tiny_model(arch=arch, seed=1)
    batch = _grouped_batch(make_rollout_batch, seed=4)
    kwargs = dict(temperature=0.8, calculate_entropy=True)
    shared = infer_micro_batches(model, batch, partial(response_log_probs, **kwargs), spec, CPU)
    plain = infer_micro_batches(model, batch, partial(_unshared, **kwargs), spec, CPU)
    for key in ("log_probs", "entropy"):
        torch.testing.assert_close(shared[key], plain[key], rtol=0, atol=2e-6)
    assert torch.all(shared["log_probs"][batch[FK.RESPONSE_MASK] == 0] == 0)


def _grads_after(model, batch, forward, spec, autocast_dtype=None) -> torch.Tensor:
    model.zero_grad(set_to_none=True)

    def loss_fn(outputs, micro):
        loss = (outputs["log_probs"] * micro[FK.ADVANTAGES]).sum()
        return loss, {"loss": loss.detach()}

    train_chunks(model, batch, forward, loss_fn, plan_chunks(model, batch, forward, spec, True), CPU, autocast_dtype)
    return torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])


@pytest.mark.parametrize("spec", [MicroBatchSpec(size=1), MicroBatchSpec(size=3), MicroBatchSpec(size=12)])
def test_gradients_equal_one_pass_per_row(make_rollout_batch, spec) -> None:
    model = build_tiny_model(seed=2)
    batch = _grouped_batch(make_rollout_batch, seed=5)
    chunks = plan_chunks(model, batch, response_log_probs, spec, training=True)
    assert all(chunk.shared_prompts for chunk in chunks)
    # A prompt's shared part is 6 columns and rows are at most 13 tokens: a micro-batch of one
    # row holds 2 prompts' worth of tokens, so size=1 runs the 3 prompts in 2 chunks.
    assert len(chunks) == (2 if spec.size == 1 else 1)
    shared = _grads_after(model, batch, response_log_probs, spec)
    plain = _grads_after(model, batch, _unshared, spec)
    assert shared.abs().max() > 0
    torch.testing.assert_close(shared, plain, rtol=1e-4, atol=1e-6)


def test_gradients_in_bf16_autocast_and_with_lora(make_rollout_batch) -> None:
    model = apply_lora(build_tiny_model(seed=3), lora_rank=4, lora_alpha=8, target_modules="all-linear")
    batch = _grouped_batch(make_rollout_batch, seed=6)
    assert shares_prompts(model, training=True)
    shared = _grads_after(model, batch, response_log_probs, MicroBatchSpec(size=4), torch.bfloat16)
    plain = _grads_after(model, batch, _unshared, MicroBatchSpec(size=4), torch.bfloat16)
    assert shared.numel() < sum(p.numel() for p in model.parameters())  # adapters only
    rel = (shared - plain).norm() / plain.norm()
    assert rel < 2e-2, f"bf16 gradients differ by {rel:.3g} relative"


def test_gradients_with_lora_on_values_only(make_rollout_batch) -> None:
    # No key depends on a trainable parameter here, every value does.
    model = apply_lora(build_tiny_model(seed=4), lora_rank=4, lora_alpha=8, target_modules=["v_proj"])
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.02)  # B starts at 0; give the adapters an effect
    batch = _grouped_batch(make_rollout_batch, seed=7)
    shared = _grads_after(model, batch, response_log_probs, MicroBatchSpec(size=3))
    plain = _grads_after(model, batch, _unshared, MicroBatchSpec(size=3))
    torch.testing.assert_close(shared, plain, rtol=1e-4, atol=1e-6)


def test_forward_functions_opt_in_by_parameter() -> None:
    assert takes_prompt_cache(partial(response_log_probs, temperature=1.0))
    assert not takes_prompt_cache(_unshared)


def test_not_shared_under_gradient_checkpointing_or_dropout(make_rollout_batch) -> None:
    batch = _grouped_batch(make_rollout_batch)
    checkpointed = build_tiny_model(seed=0)
    enable_gradient_checkpointing(checkpointed)
    assert not shares_prompts(checkpointed, training=True)
    chunks = plan_chunks(checkpointed, batch, response_log_probs, MicroBatchSpec(size=4), training=True)
    assert [c.shared_prompts for c in chunks] == [False] and chunks[0].micro_batches == make_plan(batch, MicroBatchSpec(size=4))

    dropout = build_tiny_model(seed=0)
    dropout.config.attention_dropout = 0.1
    assert shares_prompts(dropout, training=False)  # no dropout at inference
    assert not shares_prompts(dropout, training=True)  # rows would share one dropout mask
