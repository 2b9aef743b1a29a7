"""use_remove_padding: a micro-batch packed into one row (no padding computed) gives the padded
pass's log-probs, entropies, values and gradients."""

from __future__ import annotations

import copy

import pytest
import torch

from hybridflow import fields as FK
from hybridflow.engine.forward import (
    PACK_MIN_PADDING,
    pack_micro_batch,
    packs_rows,
    response_log_probs,
    response_values,
    worth_packing,
)
from hybridflow.engine.micro_batch import MicroBatchSpec, plan_micro_batches
from hybridflow.models.packed_attention import base_of, packed_name
from hybridflow.models.tiny import build_tiny_model
from hybridflow.models.value_model import ValueHeadModel

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _pair(arch: str, base: str) -> tuple[torch.nn.Module, torch.nn.Module]:
    """The same weights, once padded (``base``) and once packed."""
    padded = build_tiny_model(arch=arch, seed=1)
    padded.config._attn_implementation = base
    packed = copy.deepcopy(padded)
    packed.config._attn_implementation = packed_name(base)
    return padded, packed


def _batch(make_rollout_batch, empty_row: bool = False):
    batch = make_rollout_batch(num_rows=6, prompt_len=7, response_len=6, seed=3).batch.clone()
    if empty_row:  # a row with no response token: nothing to predict, outputs stay 0
        batch[FK.ATTENTION_MASK][2, 7:] = 0
    assert worth_packing(batch, 6)  # these tests compare the packed path, not the padded one twice
    return batch


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("base", ["eager", "sdpa"])
def test_packed_log_probs_and_gradients_equal_padded(arch, base, make_rollout_batch):
    padded, packed = _pair(arch, base)
    assert packs_rows(packed) and not packs_rows(padded)
    micro = _batch(make_rollout_batch)
    outs, grads = [], []
    for model in (padded, packed):
        model.train()
        out = response_log_probs(model, micro, calculate_entropy=True, entropy_requires_grad=False)
        weights = torch.linspace(0.5, 1.5, out["log_probs"].numel()).view_as(out["log_probs"])
        (out["log_probs"] * weights).sum().backward()
        outs.append(out)
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
    torch.testing.assert_close(outs[1]["log_probs"], outs[0]["log_probs"], atol=1e-5, rtol=0)
    torch.testing.assert_close(outs[1]["entropy"], outs[0]["entropy"], atol=1e-5, rtol=0)
    assert (grads[1] - grads[0]).norm() <= 1e-5 * grads[0].norm()
    mask = micro[FK.ATTENTION_MASK][:, 7:].bool()
    assert bool((outs[1]["log_probs"][~mask] == 0).all()) and bool((outs[1]["log_probs"][mask] < 0).all())


def test_rows_without_a_response_are_left_out_and_stay_zero(make_rollout_batch):
    padded, packed = _pair("llama", "eager")
    micro = _batch(make_rollout_batch, empty_row=True)
    with torch.no_grad():
        a = response_log_probs(padded, micro)["log_probs"]
        b = response_log_probs(packed, micro)["log_probs"]
    torch.testing.assert_close(b, a, atol=1e-5, rtol=0)
    assert bool((b[2] == 0).all())
    layout = pack_micro_batch(micro, 6)
    mask = micro[FK.ATTENTION_MASK]
    # one row of every row's real tokens but its last; row 2 (no response) left out
    expected = sum(int(mask[i].sum()) - 1 for i in range(6) if i != 2)
    assert layout.inputs["input_ids"].shape == (1, expected)
    assert layout.inputs["cu_seq_lens_q"].tolist()[-1] == expected and 2 not in layout.rows.tolist()


@pytest.mark.parametrize("base", ["eager", "sdpa"])
def test_packed_values_and_gradients_equal_padded(base, make_rollout_batch):
    backbone = build_tiny_model(arch="llama", seed=2).model
    backbone.config._attn_implementation = base
    padded = ValueHeadModel(backbone, backbone.config.hidden_size, init_std=0.1, seed=0)
    packed = copy.deepcopy(padded)
    packed.backbone.config._attn_implementation = packed_name(base)
    micro = _batch(make_rollout_batch)
    values, grads = [], []
    for model in (padded, packed):
        out = response_values(model, micro)["values"]
        out.square().sum().backward()
        values.append(out)
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
    torch.testing.assert_close(values[1], values[0], atol=1e-5, rtol=0)
    assert (grads[1] - grads[0]).norm() <= 1e-5 * grads[0].norm()


def test_a_packed_model_runs_padded_batches_as_its_base(make_rollout_batch):
    """Without segment boundaries (generation, a shared-prompt micro-batch) it is eager / sdpa."""
    for base in ("eager", "sdpa"):
        padded, packed = _pair("llama", base)
        micro = _batch(make_rollout_batch)
        ids, mask = micro[FK.INPUT_IDS], micro[FK.ATTENTION_MASK]
        with torch.no_grad():
            a = padded(input_ids=ids, attention_mask=mask, position_ids=micro[FK.POSITION_IDS]).logits
            b = packed(input_ids=ids, attention_mask=mask, position_ids=micro[FK.POSITION_IDS]).logits
        assert torch.equal(a[mask.bool()], b[mask.bool()])
        assert base_of(packed.config._attn_implementation) == base


def test_token_budget_counts_real_tokens_when_packed():
    lengths = [10, 9, 3, 3, 2]
    padded = plan_micro_batches(lengths, MicroBatchSpec(max_token_len=20))
    packed = plan_micro_batches(lengths, MicroBatchSpec(max_token_len=20, real_tokens=True))
    assert padded == [[0, 1], [2, 3, 4]]  # rows × longest: 2 × 10, then 3 × 3
    assert packed == [[0, 1], [2, 3, 4]]  # summed lengths: 19, then 8
    assert plan_micro_batches([6, 5, 5, 4], MicroBatchSpec(max_token_len=16, real_tokens=True)) == [[0, 1, 2], [3]]
    assert plan_micro_batches([6, 5, 5, 4], MicroBatchSpec(max_token_len=16)) == [[0, 1], [2, 3]]


def test_packed_name_checks_its_base():
    assert packed_name("sdpa") == "hybridflow_packed_sdpa" and base_of("hybridflow_packed_eager") == "eager"
    with pytest.raises(ValueError, match="eager"):
        packed_name("flash_attention_2")


def test_only_micro_batches_with_enough_padding_are_packed(make_rollout_batch):
    batch = make_rollout_batch(num_rows=4, prompt_len=5, response_len=4, seed=0).batch.clone()
    full = batch.clone()
    full[FK.ATTENTION_MASK].fill_(1)
    assert not worth_packing(full, 4)  # no padding: one batched kernel is faster
    # one row of 4 loses 3 of its 8 fed tokens → 3 / 32 < 10% padding: still padded
    mask = full[FK.ATTENTION_MASK].clone()
    mask[0, :3] = 0
    assert not worth_packing(full.set(FK.ATTENTION_MASK, mask), 4)
    mask[1, :2] = 0  # 5 / 32 ≥ 10%
    assert worth_packing(full.set(FK.ATTENTION_MASK, mask), 4)
    assert worth_packing(full.set(FK.ATTENTION_MASK, mask), 4, min_padding=0.2) is False  # 5 / 32 < 20%
    no_response = full.clone()
    no_response[FK.ATTENTION_MASK][:, 5:] = 0
    assert not worth_packing(no_response, 4)
    assert 0 < PACK_MIN_PADDING < 1
