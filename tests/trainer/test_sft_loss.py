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
    shares = [sft_loss(token_log_probs(Bigram(), batch[i : i + 1]), batch[i : i + 1], batch_num_tokens=4)[0] for i in (0, 1)]
    assert sum(s.item() for s in shares) == pytest.approx(1.5 * LN2, rel=1e-6)
    assert masked_nll_sum(outputs[LOG_PROBS], batch[LOSS_MASK]) == (pytest.approx(6 * LN2), 4)


def _tiny_batch(tiny_model_dir, num_rows: int = 6) -> TensorDict:
    from hybridflow.data.sft_dataset import tokenize_conversation
    from hybridflow.models import load_tokenizer

    tokenizer = load_tokenizer(tiny_model_dir)
    rows = []
    for i in range(num_rows):
        messages = [{"role": "user", "content": f"What is {i} + {i * 3}?" + " Think." * (i % 3)},
                    {"role": "assistant", "content": f"{i} + {i * 3} = {4 * i}\n#### {4 * i}"}]
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
