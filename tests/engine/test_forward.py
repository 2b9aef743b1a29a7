"""Response log-probs / entropy / values over trimmed micro-batches match a plain full forward."""

from __future__ import annotations

from functools import partial

import pytest
import torch

from hybridflow import fields as FK
from hybridflow.engine import MicroBatchSpec
from hybridflow.engine.forward import (
    compute_position_ids,
    response_log_probs,
    response_values,
    response_window,
)
from hybridflow.engine.micro_batch_runner import infer_micro_batches
from hybridflow.models.tiny import build_tiny_model
from hybridflow.models.value_model import ValueHeadModel

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def model() -> torch.nn.Module:
    return build_tiny_model(seed=0)


def _reference_log_probs(model, batch, temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Full-width forward, no trimming: logits at P−1 … L−2, scaled by 1/τ."""
    t = batch[FK.RESPONSES].shape[1]
    with torch.no_grad():
        logits = model(input_ids=batch[FK.INPUT_IDS], attention_mask=batch[FK.ATTENTION_MASK],
                       position_ids=batch[FK.POSITION_IDS]).logits[:, -t - 1 : -1].float() / temperature
    logp = torch.log_softmax(logits, -1)
    chosen = logp.gather(-1, batch[FK.RESPONSES].unsqueeze(-1)).squeeze(-1)
    entropy = -(logp.exp() * logp).sum(-1)
    mask = batch[FK.RESPONSE_MASK]
    return chosen * mask, entropy * mask


@pytest.mark.parametrize(
    "spec", [None, MicroBatchSpec(size=1), MicroBatchSpec(size=3), MicroBatchSpec(max_token_len=22)]
)
def test_log_probs_match_full_forward_for_any_split(model, make_rollout_batch, spec) -> None:
    batch = make_rollout_batch(num_rows=8, seed=1).batch
    fwd = partial(response_log_probs, temperature=0.7, calculate_entropy=True)
    out = infer_micro_batches(model, batch, fwd, spec, CPU)
    ref_lp, ref_ent = _reference_log_probs(model, batch, 0.7)
    torch.testing.assert_close(out["log_probs"], ref_lp, rtol=0, atol=1e-5)
    torch.testing.assert_close(out["entropy"], ref_ent, rtol=0, atol=1e-5)
    # masked positions are exactly zero whatever the grouping
    assert torch.all(out["log_probs"][batch[FK.RESPONSE_MASK] == 0] == 0)


def test_chunked_entropy_matches(model, make_rollout_batch) -> None:
    batch = make_rollout_batch(seed=2).batch
    plain = infer_micro_batches(model, batch, partial(response_log_probs, calculate_entropy=True), None, CPU)
    chunked = infer_micro_batches(
        model, batch, partial(response_log_probs, calculate_entropy=True, chunked_entropy=True), None, CPU
    )
    torch.testing.assert_close(plain["entropy"], chunked["entropy"], rtol=0, atol=1e-5)


def test_window_trims_common_padding() -> None:
    # P = 4, T = 3; real tokens in columns 2..4 only
    mask = torch.tensor([[0, 0, 1, 1, 1, 0, 0], [0, 0, 0, 1, 0, 0, 0]])
    w = response_window(mask, 3)
    assert (w.lo, w.hi, w.prompt_len, w.n_response) == (2, 5, 4, 1)
    # an empty response still keeps P − 1 … P
    w = response_window(torch.tensor([[0, 1, 1, 0, 0]]), 2)
    assert (w.lo, w.hi) == (1, 4)


def test_window_rejects_bad_widths() -> None:
    with pytest.raises(ValueError, match="rows need a prompt and a response"):
        response_window(torch.ones(2, 3), 3)


def test_position_ids_count_real_tokens() -> None:
    mask = torch.tensor([[0, 0, 1, 1, 1, 0]])
    assert compute_position_ids(mask).tolist() == [[0, 0, 0, 1, 2, 2]]


def test_values_come_from_positions_before_each_token(model, make_rollout_batch) -> None:
    critic = ValueHeadModel(model.model, 128, 0.02, seed=0)
    batch = make_rollout_batch(seed=3).batch
    out = infer_micro_batches(critic, batch, response_values, MicroBatchSpec(size=2), CPU)
    t = batch[FK.RESPONSES].shape[1]
    with torch.no_grad():
        full = critic(batch[FK.INPUT_IDS], batch[FK.ATTENTION_MASK], batch[FK.POSITION_IDS])[:, -t - 1 : -1]
    torch.testing.assert_close(out["values"], full * batch[FK.RESPONSE_MASK], rtol=0, atol=1e-5)


def test_missing_attention_mask_is_named(model, make_rollout_batch) -> None:
    batch = make_rollout_batch().batch.exclude(FK.ATTENTION_MASK)
    with pytest.raises(KeyError, match="attention_mask"):
        infer_micro_batches(model, batch, response_log_probs, MicroBatchSpec(size=2), CPU)
