"""Attention over packed sequences (``model.use_remove_padding``): several rows in one row.

A packed micro-batch is one sequence of every row's real tokens back to back — no padding
column is computed by any projection or MLP. Rows must not attend to each other, so attention
runs per row (a "segment"): the forward passes the segment boundaries as HF's
``cu_seq_lens_q`` / ``cu_seq_lens_k`` keyword arguments (cumulative lengths ``[0, n₀, n₀+n₁,
...]``), which transformers hands to the attention function unchanged.

HF has no CPU kernel for that (``flash_attention_2`` is CUDA-only, and its SDPA/eager path for
packed position ids builds a dense N×N mask, quadratic in the packed length), so this module
registers two attention implementations with transformers' ``AttentionInterface``:
``hybridflow_packed_eager`` and ``hybridflow_packed_sdpa``. Given segment boundaries they run
causal attention segment by segment (eager: scores, softmax, values; sdpa: torch's kernel);
without them (an ordinary padded batch, generation with a cache) they compute exactly what
``eager`` / ``sdpa`` compute, with the matching mask format. A model loaded with one of them
therefore runs padded and packed micro-batches alike.

Sliding-window layers (Gemma 3's local layers, Mistral, Qwen2/3 with ``use_sliding_window``)
pass ``sliding_window``: inside a segment a query then sees only the keys less than the window
behind it (HF's rule, q − k < window), as HF's sliding mask does for a padded row. Gemma 2's
``softcap`` on the scores is applied by the eager kernels; SDPA cannot, and refuses it as HF's
does.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, eager_mask, sdpa_mask

PACKED_PREFIX = "hybridflow_packed_"
BASES: tuple[str, ...] = ("eager", "sdpa")


def packed_name(base: str) -> str:
    """The registered implementation that packs on top of ``base`` (eager or sdpa)."""
    if base not in BASES:
        raise ValueError(f"packed attention builds on {BASES}, got {base!r}")
    return PACKED_PREFIX + base


def base_of(name: str) -> str:
    """``eager`` / ``sdpa`` for a packed implementation name, the name itself otherwise."""
    return name.removeprefix(PACKED_PREFIX)


def _repeat_kv(x: torch.Tensor, groups: int) -> torch.Tensor:
    """(b, kv, n, d) → (b, kv·groups, n, d): each key/value head serves ``groups`` query heads."""
    return x if groups == 1 else x.repeat_interleave(groups, dim=1)


def _eager(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: torch.Tensor | None,
    scaling: float,
    dropout: float,
    training: bool,
    softcap: float | None = None,
) -> torch.Tensor:
    """softmax(q kᵀ · scale + mask) v in float32 softmax, as HF's eager kernel; (b, h, n, d) out.
    ``softcap``: the scores become cap · tanh(scores / cap) before the mask (HF's order)."""
    scores = torch.matmul(query, key.transpose(2, 3)) * scaling
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    if mask is not None:
        scores = scores + mask[:, :, :, : key.shape[-2]]
    weights = torch.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
    weights = F.dropout(weights, p=dropout, training=training)
    return torch.matmul(weights, value)


def _segments(cu_seq_lens: torch.Tensor) -> list[tuple[int, int]]:
    bounds = [int(x) for x in cu_seq_lens.tolist()]
    return [(a, b) for a, b in zip(bounds[:-1], bounds[1:]) if b > a]


def _allowed(n: int, window: int | None, device: torch.device) -> torch.Tensor | None:
    """(n, n) bool: causal, and within ``window`` of the query when set; None when plain causal."""
    if window is None or window >= n:
        return None
    offsets = torch.arange(n, device=device)[:, None] - torch.arange(n, device=device)[None]
    return (offsets >= 0) & (offsets < window)


def _packed(
    module: torch.nn.Module, query, key, value, base: str, scaling: float, dropout: float, cu, window, softcap
) -> torch.Tensor:
    """Causal (or sliding-window) attention inside each segment of the one packed row; (1, n, h, d) out."""
    groups = query.shape[1] // key.shape[1]
    key, value = _repeat_kv(key, groups), _repeat_kv(value, groups)
    parts = []
    for start, end in _segments(cu):
        q, k, v = query[:, :, start:end], key[:, :, start:end], value[:, :, start:end]
        n = end - start
        allowed = _allowed(n, window, q.device)
        if base == "sdpa":
            p = dropout if module.training else 0.0
            out = F.scaled_dot_product_attention(
                q, k, v, attn_mask=allowed, dropout_p=p, is_causal=allowed is None, scale=scaling
            )
        else:
            if allowed is None:
                allowed = torch.ones(n, n, dtype=torch.bool, device=q.device).tril()
            bias = torch.zeros(n, n, dtype=q.dtype, device=q.device).masked_fill_(~allowed, torch.finfo(q.dtype).min)
            out = _eager(q, k, v, bias[None, None], scaling, dropout, module.training, softcap)
        parts.append(out)
    return torch.cat(parts, dim=2).transpose(1, 2).contiguous()


def _forward(base: str):
    def attention(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None, **kwargs):
        scale = module.head_dim**-0.5 if scaling is None else scaling
        cu = kwargs.get("cu_seq_lens_q")
        softcap = kwargs.get("softcap")
        if cu is not None:
            if query.shape[0] != 1:
                raise ValueError(f"a packed forward holds one row of rows, got batch size {query.shape[0]}")
            if base == "sdpa" and softcap is not None:
                raise ValueError("sdpa attention cannot apply the score softcap; use attn_implementation=eager")
            window = kwargs.get("sliding_window")
            return _packed(module, query, key, value, base, scale, dropout, cu, window, softcap), None
        if base == "sdpa":
            return sdpa_attention_forward(
                module, query, key, value, attention_mask, dropout=dropout, scaling=scale, **kwargs
            )
        groups = query.shape[1] // key.shape[1]
        key, value = _repeat_kv(key, groups), _repeat_kv(value, groups)
        out = _eager(query, key, value, attention_mask, scale, dropout, module.training, softcap)
        return out.transpose(1, 2).contiguous(), None

    return attention


for _base, _mask in (("eager", eager_mask), ("sdpa", sdpa_mask)):
    AttentionInterface.register(packed_name(_base), _forward(_base))
    AttentionMaskInterface.register(packed_name(_base), _mask)
