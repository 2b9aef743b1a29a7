"""The SFT objective: aligned token log-probs, token-mean NLL, micro-batch split invariance."""

from __future__ import annotations

import copy
import math
from functools import partial
from types import SimpleNamespace

import pytest
import torch
from tensordict import TensorDict

from hybridflow.data.sft_dataset import LOSS_MASK, right_pad
from hybridflow.engine import MicroBatchSpec, TorchEngine
from hybridflow.trainer.supervised.sft_loss import (
    LOG_PROBS,
    masked_nll_sum,
    sft_loss,
    token_log_probs,
)
from hybridflow.trainer.supervised.sft_trainer import to_tensordict

LN2 = math.log(2.0)


class Bigram(torch.nn.Module):
    """logits at position t depend only on token t: row r of the table is log([¼, ¼, ¼]) with ½ at r."""

    def __init__(self) -> None:
        super().__init__()
        probs = torch.full((3, 3), 0.25) + 0.25 * torch.eye(3)
        self.table = torch.nn.Parameter(probs.log())

    def forward(self, input_ids, attention_mask, position_ids, use_cache):
        return SimpleNamespace(logits=self.table[input_ids])


def _batch(rows: list[tuple[list[int], list[int]]], width: int) -> TensorDict:
    items = [right_pad(ids, mask, width, pad_token_id=0) for ids, mask in rows]
    return to_tensordict({k: torch.stack([item[k] for item in items]) for k in items[0]})


ROWS = [([0, 1, 1, 2], [0, 1, 1, 0]), ([2, 2, 0], [0, 1, 1])]


def test_token_log_probs_are_aligned_with_the_tokens():
    batch = _batch(ROWS, width=6)
    out = token_log_probs(Bigram(), batch)[LOG_PROBS]
    q, h = math.log(0.25), math.log(0.5)
    # row 0: p(1|0)=¼, p(1|1)=½, p(2|1)=¼; row 1: p(2|2)=½, p(0|2)=¼; 0 at column 0 and on padding
    expected = torch.tensor([[0, q, h, q, 0, 0], [0, h, q, 0, 0, 0]])
    assert torch.allclose(out, expected, atol=1e-6)


def test_sft_loss_is_the_token_mean_nll_of_the_target_tokens():
    batch = _batch(ROWS, width=5)
    outputs = token_log_probs(Bigram(), batch)
    loss, metrics = sft_loss(outputs, batch, batch_num_tokens=4)
    # targets: ¼, ½ (row 0) and ½, ¼ (row 1): (2·ln4 + 2·ln2) / 4 = 1.5·ln2
    assert loss.item() == pytest.approx(1.5 * LN2, rel=1e-6)
    assert metrics["loss"].item() == pytest.approx(1.5 * LN2, rel=1e-6)
    # each row alone, normalised by the whole batch's 4 tokens, adds up to the same loss
    shares = [
        sft_loss(token_log_probs(Bigram(), batch[i : i + 1]), batch[i : i + 1], batch_num_tokens=4)[0] for i in (0, 1)
    ]
    assert sum(s.item() for s in shares) == pytest.approx(1.5 * LN2, rel=1e-6)
    assert masked_nll_sum(outputs[LOG_PROBS], batch[LOSS_MASK]) == (pytest.approx(6 * LN2), 4)


def _tiny_batch(tiny_model_dir, num_rows: int = 6) -> TensorDict:
    from hybridflow.data.sft_dataset import tokenize_conversation
    from hybridflow.models import load_tokenizer

    tokenizer = load_tokenizer(tiny_model_dir)
    rows = []
    for i in range(num_rows):
        messages = [
            {"role": "user", "content": f"What is {i} + {i * 3}?" + " Think." * (i % 3)},
            {"role": "assistant", "content": f"{i} + {i * 3} = {4 * i}\n#### {4 * i}"},
        ]
        rows.append(tokenize_conversation(tokenizer, messages))
    return _batch(rows, width=max(len(ids) for ids, _ in rows) + 3)


@pytest.mark.parametrize("spec", [MicroBatchSpec(size=1), MicroBatchSpec(size=4), MicroBatchSpec(max_token_len=80)])
def test_micro_batch_split_gives_the_full_batch_loss_and_gradient(tiny_model_dir, spec):
    from hybridflow.models import load_model_and_tokenizer

    batch = _tiny_batch(tiny_model_dir)
    model, _ = load_model_and_tokenizer(tiny_model_dir)
    tokens = int(batch[LOSS_MASK].sum())
    results = []
    for micro in (None, spec):
        engine = TorchEngine(copy.deepcopy(model), lr=1e-3)
        metrics = engine.forward_backward(batch, token_log_probs, partial(sft_loss, batch_num_tokens=tokens), micro)
        grads = torch.cat([p.grad.flatten() for p in engine.module.parameters()])
        results.append((sum(m["loss"].item() for m in metrics), grads, len(metrics)))
    (full_loss, full_grad, n_full), (split_loss, split_grad, n_split) = results
    assert n_full == 1 and n_split > 1
    assert split_loss == pytest.approx(full_loss, rel=1e-5)
    assert torch.allclose(split_grad, full_grad, rtol=1e-4, atol=1e-7)


# --- packed rows (model.use_remove_padding) ---------------------------------------------------


def _tiny_models(tiny_model_dir, base: str) -> tuple[torch.nn.Module, torch.nn.Module]:
    """The tiny model twice, the same weights: ``base`` attention, and its packed variant."""
    from hybridflow.models import load_model_and_tokenizer
    from hybridflow.models.packed_attention import packed_name

    padded, _ = load_model_and_tokenizer(tiny_model_dir, attn_implementation=base)
    packed, _ = load_model_and_tokenizer(tiny_model_dir, attn_implementation=packed_name(base))
    packed.load_state_dict(padded.state_dict())
    return padded, packed


class _CountPackedCalls:
    """Wraps a module: counts forwards that got segment boundaries (a packed row)."""

    def __init__(self, module: torch.nn.Module) -> None:
        self.module, self.packed_calls = module, 0
        self.config = module.config

    def __call__(self, **kwargs):
        self.packed_calls += "cu_seq_lens_q" in kwargs
        return self.module(**kwargs)


@pytest.mark.parametrize("base", ["eager", "sdpa"])
def test_packed_rows_give_the_padded_loss_and_gradients(tiny_model_dir, base):
    """One step's loss and every parameter's gradient, packed vs padded, in fp32: within 1e-5
    relative (the same sums in another order). 6 conversations of 30-44 tokens in a width of 47,
    86 target tokens; micro-batches of 4 rows, so one packed row holds 4 conversations."""
    batch = _tiny_batch(tiny_model_dir)
    tokens = int(batch[LOSS_MASK].sum())
    results = []
    for model in _tiny_models(tiny_model_dir, base):
        engine = TorchEngine(model, lr=1e-3)
        metrics = engine.forward_backward(
            batch, token_log_probs, partial(sft_loss, batch_num_tokens=tokens), MicroBatchSpec(size=4)
        )
        grads = {name: p.grad.clone() for name, p in engine.module.named_parameters()}
        results.append((sum(m["loss"].item() for m in metrics), grads))
    (padded_loss, padded_grads), (packed_loss, packed_grads) = results
    assert 2.0 < padded_loss < 12.0  # an untrained model: about ln(vocabulary)
    assert packed_loss == pytest.approx(padded_loss, rel=1e-5)
    for name, grad in padded_grads.items():
        assert float((packed_grads[name] - grad).norm()) <= 1e-5 * float(grad.norm()), name


def test_attention_does_not_leak_across_packed_conversations(tiny_model_dir):
    """Conversations A and B share one packed row; changing A's tokens changes A's log-probs
    and leaves B's exactly as they were. The control: the same packed row run as one plain
    sequence (no segment boundaries, positions counting on) does change B's."""
    from hybridflow.engine.forward import pack_micro_batch

    _, packed = _tiny_models(tiny_model_dir, "eager")
    counting = _CountPackedCalls(packed)
    batch = _tiny_batch(tiny_model_dir, num_rows=2)
    changed = batch.clone()
    a_len = int(batch["attention_mask"][0].sum())
    changed["input_ids"][0, 1:a_len] = (batch["input_ids"][0, 1:a_len] + 7) % 500
    with torch.no_grad():
        before = token_log_probs(counting, batch)[LOG_PROBS]
        after = token_log_probs(counting, changed)[LOG_PROBS]
    assert counting.packed_calls == 2  # both went through the packed path
    assert not torch.allclose(after[0], before[0])
    assert torch.equal(after[1], before[1])
    # control: without segment boundaries B attends to A, and B's log-probs move
    plain = {}
    for name, rows in (("before", batch), ("after", changed)):
        inputs = pack_micro_batch(rows, rows["input_ids"].shape[1] - 1).inputs
        n = inputs["input_ids"].shape[1]
        with torch.no_grad():
            logits = packed(input_ids=inputs["input_ids"], position_ids=torch.arange(n)[None], use_cache=False).logits
        plain[name] = torch.log_softmax(logits[0, a_len:], dim=-1)  # B's positions
    assert not torch.allclose(plain["after"], plain["before"], atol=1e-4)


def test_packed_rows_must_be_right_padded(tiny_model_dir):
    _, packed = _tiny_models(tiny_model_dir, "eager")
    batch = _tiny_batch(tiny_model_dir, num_rows=2)
    batch["attention_mask"][1, 0] = 0  # a real token after a padding position
    with pytest.raises(ValueError, match="packed SFT rows must be right-padded"):
        token_log_probs(packed, batch)


def test_packed_rows_with_non_finite_logits_name_the_conversations(tiny_model_dir):
    from hybridflow.inference.sampling import NonFiniteLogitsError

    _, packed = _tiny_models(tiny_model_dir, "eager")
    batch = _tiny_batch(tiny_model_dir, num_rows=3)
    with torch.no_grad():
        packed.get_output_embeddings().weight[:, 0] = float("nan")  # every logit of every position
    with pytest.raises(NonFiniteLogitsError, match="non-finite logits .* for 3 of 3 rows"):
        token_log_probs(packed, batch)
