"""The actor's packed rows (``use_remove_padding``) honour sliding windows and score softcaps.

Packing runs attention segment by segment (``hybridflow.models.packed_attention``), outside
HF's mask builders, so Gemma 3's local layers must apply their window there themselves.
"""

from __future__ import annotations

import copy

import pytest
import torch
from tensordict import TensorDict
from transformers import AttentionInterface
from transformers.models.gemma2.modeling_gemma2 import eager_attention_forward as gemma2_eager

from hybridflow import fields as FK
from hybridflow.engine.forward import packs_rows, response_log_probs, worth_packing
from hybridflow.models.packed_attention import packed_name
from hybridflow.models.tiny import TINY_GEMMA3_SLIDING_WINDOW, build_tiny_model

pytestmark = pytest.mark.usefixtures("one_torch_thread")

PROMPT, RESPONSE = 9, 10


def _rows() -> TensorDict:
    """5 rows, prompt left-padded and response right-padded by different amounts; the longest
    row (19 tokens) is more than twice the tiny Gemma 3's window."""
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(4, 500, (5, PROMPT + RESPONSE), generator=gen)
    mask = torch.ones_like(ids)
    for row, (left, right) in enumerate([(0, 0), (3, 2), (1, 5), (4, 0), (2, 7)]):
        mask[row, :left] = 0
        mask[row, PROMPT + RESPONSE - right :] = 0
    ids = ids * mask + 3 * (1 - mask)
    tensors = {
        FK.INPUT_IDS: ids,
        FK.ATTENTION_MASK: mask,
        FK.POSITION_IDS: (mask.cumsum(-1) - 1).clamp(min=0),
        FK.RESPONSES: ids[:, PROMPT:],
    }
    return TensorDict(tensors, batch_size=[5])


@pytest.mark.parametrize("base", ["eager", "sdpa"])
def test_gemma3_packed_rows_equal_padded_rows(base):
    padded = build_tiny_model(arch="gemma3", seed=1)
    padded.config._attn_implementation = base
    packed = copy.deepcopy(padded)
    packed.config._attn_implementation = packed_name(base)
    rows = _rows()
    assert packs_rows(packed) and worth_packing(rows, RESPONSE)
    assert int(rows[FK.ATTENTION_MASK].sum(1).max()) > 2 * TINY_GEMMA3_SLIDING_WINDOW
    outs, grads = [], []
    for model in (padded, packed):
        model.train()
        out = response_log_probs(model, rows)["log_probs"]
        out.sum().backward()
        outs.append(out.detach())
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None]))
    torch.testing.assert_close(outs[1], outs[0], atol=1e-5, rtol=0)
    assert (grads[1] - grads[0]).norm() <= 1e-5 * grads[0].norm()
    # evidence that the window mattered: the same weights without it give other log-probs
    config = type(padded.config)(**{**padded.config.to_dict(), "sliding_window": 4096})
    unwindowed = type(padded)(config).eval()
    unwindowed.load_state_dict(padded.state_dict())
    with torch.no_grad():
        assert (response_log_probs(unwindowed, rows)["log_probs"] - outs[0]).abs().max().item() > 1e-2


class _Attention(torch.nn.Module):
    head_dim = 8
    num_key_value_groups = 2


@pytest.mark.parametrize("packed", [True, False])
def test_packed_eager_applies_the_score_softcap_as_hf(packed):
    gen = torch.Generator().manual_seed(0)
    n = 6
    q = torch.randn(1, 4, n, 8, generator=gen) * 4  # large scores: the cap (2.0) bites
    k, v = torch.randn(1, 2, n, 8, generator=gen) * 4, torch.randn(1, 2, n, 8, generator=gen)
    causal = torch.full((n, n), torch.finfo(q.dtype).min).triu(1)[None, None]
    module = _Attention().eval()
    expected, _ = gemma2_eager(module, q, k, v, causal, scaling=0.3, softcap=2.0)
    uncapped, _ = gemma2_eager(module, q, k, v, causal, scaling=0.3)
    assert (expected - uncapped).abs().max() > 0.1
    attention = AttentionInterface()[packed_name("eager")]
    kwargs = {"cu_seq_lens_q": torch.tensor([0, n], dtype=torch.int32)} if packed else {}
    ours, _ = attention(module, q, k, v, None if packed else causal, scaling=0.3, softcap=2.0, **kwargs)
    torch.testing.assert_close(ours, expected, atol=1e-6, rtol=0)


def test_packed_sdpa_refuses_a_score_softcap():
    q, kv = torch.zeros(1, 4, 3, 8), torch.zeros(1, 2, 3, 8)
    attention = AttentionInterface()[packed_name("sdpa")]
    cu = torch.tensor([0, 3], dtype=torch.int32)
    with pytest.raises(ValueError, match="sdpa attention cannot apply the score softcap"):
        attention(_Attention(), q, kv, kv, None, scaling=0.3, softcap=2.0, cu_seq_lens_q=cu)
