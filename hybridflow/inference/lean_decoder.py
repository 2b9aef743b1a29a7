"""A lean forward pass for Llama-family decoders (Llama, Qwen2, Mistral, Qwen3) and Gemma 3.

It runs the same math as the Hugging Face modules, reading their own parameters, without
HF's per-step machinery (cache objects, mask builders, output dataclasses, hooks):

    x ← embed(ids)
    per layer:  h = rms(x)·w_in;   q,k,v = h·W_qkvᵀ (+b);   q,k ← rope(q,k, pos)
                write k,v into the preallocated cache column;   a = softmax(q·Kᵀ/√d + mask)·V
                x ← x + a·W_oᵀ;   h = rms(x)·w_post;   x ← x + (silu(h·W_gᵀ) ⊙ h·W_uᵀ)·W_dᵀ
    logits = rms(x_last)·w_final · W_lmᵀ

Qwen3 adds an RMSNorm of each query/key head before RoPE; Gemma 3 changes the norms, the MLP,
the attention scale and per-layer windows and RoPE bases (:mod:`hybridflow.inference.lean_families`
lists each difference; :class:`~hybridflow.inference.lean_families.FamilySpec` carries them).

RMSNorm: ``w · (x / sqrt(mean(x²) + eps))`` computed in fp32 and cast back before the weight
multiply (as HF does). RoPE cos/sin come from the model's own ``rotary_emb`` module, so
every RoPE variant it computes statelessly (default, linear, llama3, yarn) is reproduced.
Grouped-query attention needs no repeated keys: in a decode step the ``g = H / H_kv`` query
heads of one key/value head are laid out as ``g`` query rows of that head.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol, cast

import torch
import torch.nn.functional as F
from torch import nn

from hybridflow.inference.kv_cache import KVCache
from hybridflow.inference.lean_families import (
    SUPPORTED_MODEL_TYPES,
    FamilySpec,
    family_spec,
    lean_unsupported_reason,
)
from hybridflow.inference.prefix import shared_prefix_length
from hybridflow.inference.projections import Projection

if TYPE_CHECKING:
    from transformers import PreTrainedConfig

__all__ = ["SUPPORTED_MODEL_TYPES", "LeanDecoder", "lean_unsupported_reason", "lean_view", "unwrap_peft"]

_MIN_SHARED_PREFIX = 8  # shorter shared prefixes are not worth a separate pass


# The module tree of a Llama-family *ForCausalLM as the lean path reads it (checked by
# lean_unsupported_reason). A projection may also be a peft LoRA layer wrapping the nn.Linear:
# it has the same in_features/out_features/weight/bias, and Projection handles it.
class _Norm(Protocol):
    weight: torch.Tensor


class _Attention(Protocol):
    q_proj: nn.Linear
    k_proj: nn.Linear
    v_proj: nn.Linear
    o_proj: nn.Linear


class _MLP(Protocol):
    gate_proj: nn.Linear
    up_proj: nn.Linear
    down_proj: nn.Linear


class _DecoderLayer(Protocol):
    self_attn: _Attention
    mlp: _MLP
    input_layernorm: _Norm
    post_attention_layernorm: _Norm  # Gemma also has pre_/post_feedforward_layernorm


class _Backbone(Protocol):
    embed_tokens: nn.Embedding
    norm: _Norm
    rotary_emb: nn.Module  # (x, position_ids[, layer_type]) → (cos, sin)
    layers: Sequence[_DecoderLayer]


class LeanModel(Protocol):
    """A *ForCausalLM the lean path can run (:func:`lean_unsupported_reason` is None), as it reads it."""

    config: PreTrainedConfig
    model: _Backbone
    lm_head: nn.Linear

    def get_input_embeddings(self) -> nn.Embedding: ...


def unwrap_peft(model: nn.Module) -> nn.Module:
    """The Hugging Face model inside a ``peft.PeftModel`` (LoRA layers stay injected in it)."""
    get_base_model = getattr(model, "get_base_model", None)
    return model if get_base_model is None else get_base_model()


def lean_view(model: nn.Module) -> LeanModel:
    """``model`` (unwrapped, with :func:`lean_unsupported_reason` None) typed as the tree the lean path reads."""
    return cast(LeanModel, model)


def _decode_attention(
    q: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    bias: torch.Tensor | None,
    scale: float | None,
) -> torch.Tensor:
    """softmax(q·Kᵀ/√d + bias)·V for a few query rows per head: (b, h, g, d), (b, h, L, d) → (b, h, g, d).

    ``bias`` (b·h, 1, L) is 0 for a visible key and -inf for a hidden one, built once per step
    (:func:`_additive_masks`); the scale and the bias go into the score matmul (``baddbmm``),
    so a layer runs three kernels. SDPA's CPU kernel tiles the queries for long sequences; for
    g = 3 rows it costs more than two batched matmuls and a softmax, and gets slower, not
    faster, with a second thread.
    """
    b, h, g, d = q.shape
    length = keys.shape[2]
    alpha = d**-0.5 if scale is None else scale
    # Views of the cache, no copies: (b, h) merge into one batch dimension of stride L_max·d.
    q3, k3, v3 = q.reshape(b * h, g, d), keys.reshape(b * h, length, d), values.reshape(b * h, length, d)
    if bias is None:
        scores = torch.bmm(q3, k3.transpose(1, 2)).mul_(alpha)
    else:
        scores = torch.baddbmm(bias, q3, k3.transpose(1, 2), alpha=alpha)
    return torch.bmm(torch.softmax(scores, dim=-1), v3).view(b, h, g, d)


def _additive_masks(
    masks: dict[int | None, torch.Tensor | None], kv_heads: int
) -> dict[int | None, torch.Tensor | None]:
    """Boolean (rows, 1, 1, L) masks → additive (rows · kv_heads, 1, L) ones (0 or -inf), per window."""
    out: dict[int | None, torch.Tensor | None] = {}
    for window, mask in masks.items():
        if mask is None:
            out[window] = None
            continue
        bias = torch.zeros(mask.shape, dtype=torch.float32, device=mask.device).masked_fill_(~mask, float("-inf"))
        out[window] = bias.view(mask.shape[0], 1, mask.shape[-1]).repeat_interleave(kv_heads, dim=0)
    return out


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x·cos + rotate_half(x)·sin with rotate_half(x) = (−x₂, x₁) over the last dim.

    ``sin`` comes with its first half negated (:meth:`LeanDecoder._size_rope_table`):
    (x₂, x₁)·(−s₁, s₂) equals (−x₂, x₁)·(s₁, s₂) exactly and saves the negation.
    """
    half = x.shape[-1] // 2
    return x * cos + torch.cat((x[..., half:], x[..., :half]), dim=-1) * sin


class _Layer:
    def __init__(self, layer: _DecoderLayer, spec: FamilySpec, index: int, weight_format: str, dtype: torch.dtype):
        attn, mlp = layer.self_attn, layer.mlp
        names = ["input_layernorm", "post_attention_layernorm"]
        if spec.gemma:  # norms on both sides of attention and of the MLP
            names += ["pre_feedforward_layernorm", "post_feedforward_layernorm"]
        self.norms: dict[str, _Norm] = {name: getattr(layer, name) for name in names}
        if spec.qk_norm:
            self.norms.update({name: getattr(attn, name) for name in ("q_norm", "k_norm")})
        # Norm weights in the compute dtype: the parameters themselves when the dtypes agree.
        self.w: dict[str, torch.Tensor] = {name: norm.weight for name, norm in self.norms.items()}
        self.window = spec.windows[index]
        self.rope_type = spec.rope_types[index]
        self.qkv = Projection([attn.q_proj, attn.k_proj, attn.v_proj], weight_format, dtype)
        self.o = Projection([attn.o_proj], weight_format, dtype)
        self.gate = Projection([mlp.gate_proj], weight_format, dtype)
        self.up = Projection([mlp.up_proj], weight_format, dtype)
        self.down = Projection([mlp.down_proj], weight_format, dtype)

    def recast_norms(self, dtype: torch.dtype) -> None:
        self.w = {name: norm.weight.detach().to(dtype) for name, norm in self.norms.items()}

    def projections(self) -> tuple[Projection, ...]:
        return (self.qkv, self.o, self.gate, self.up, self.down)


class LeanDecoder:
    """Prefill + one-token decode steps over a preallocated :class:`KVCache`.

    ``weight_format`` is ``"shared"`` (read the module's parameters directly; no copy) or
    ``"packed"`` (fused oneDNN copies refreshed when the module's parameters change); see
    :mod:`hybridflow.inference.projections`. ``dtype`` is the compute dtype (default:
    the module's); a dtype other than the module's needs ``"packed"`` (e.g. bf16 sampling
    from an fp32 training module).
    """

    def __init__(self, model: nn.Module, weight_format: str = "shared", dtype: torch.dtype | None = None) -> None:
        reason = lean_unsupported_reason(model)
        if reason is not None:
            raise ValueError(f"the lean decoder cannot run this model: {reason}")
        model = unwrap_peft(model)
        lm = lean_view(model)
        config = lm.config.get_text_config()
        self.spec = spec = family_spec(lm.config)
        self.model = model
        self.weight_format = weight_format
        self.compute_dtype = lm.model.embed_tokens.weight.dtype if dtype is None else dtype
        # On CPU, attention of one query token over a bf16 cache is several times slower than
        # over an fp32 one (and rounds the scores), so the cache holds fp32 there.
        cpu = lm.model.embed_tokens.weight.device.type == "cpu"
        self.cache_dtype = torch.float32 if cpu else self.compute_dtype
        # Shared fp32 weights reproduce HF's kernels call for call (decode attention included);
        # packed weights take the faster kernels, which round differently.
        self.hf_numerics = weight_format == "shared" and self.compute_dtype == self.cache_dtype
        self.num_heads: int = config.num_attention_heads
        self.kv_heads: int = config.num_key_value_heads
        self.head_dim: int = getattr(config, "head_dim", None) or config.hidden_size // self.num_heads
        self.eps = spec.eps
        self.norm = spec.norm
        self.embed = lm.model.embed_tokens
        self.embed_scale: torch.Tensor | None = getattr(self.embed, "embed_scale", None) if spec.gemma else None
        self.final_norm = lm.model.norm
        self.rotary = lm.model.rotary_emb
        self.layers = [
            _Layer(layer, spec, i, weight_format, self.compute_dtype) for i, layer in enumerate(lm.model.layers)
        ]
        self.lm_head = Projection([lm.lm_head], weight_format, self.compute_dtype)
        self.w_final: torch.Tensor = self.final_norm.weight
        self.cache: KVCache | None = None
        self._rope_tables: dict[str | None, tuple[torch.Tensor, torch.Tensor]] = {}

    # ---- weights ---------------------------------------------------------------------------
    def projections(self) -> list[Projection]:
        """Every projection in the order a decode step runs them (``benchmarks/rollout.py`` times
        them alone: the step's matmul floor)."""
        return [p for layer in self.layers for p in layer.projections()] + [self.lm_head]

    def refresh_weights(self) -> int:
        """Re-pack stale projections (``packed`` format); returns how many were re-packed."""
        # Gemma's norms compute in fp32 from the parameters themselves, whatever the dtype.
        if self.compute_dtype != self.embed.weight.dtype and not self.spec.gemma:
            # A few KB per layer: cheaper to re-cast at every call than to track versions.
            with torch.no_grad():
                for layer in self.layers:
                    layer.recast_norms(self.compute_dtype)
                self.w_final = self.final_norm.weight.detach().to(self.compute_dtype)
        return sum(p.refresh() for p in self.projections())

    def invalidate_weights(self) -> None:
        for p in self.projections():
            p.invalidate()

    def release(self) -> None:
        """Free the KV cache and packed copies; the next prefill rebuilds what it needs."""
        self.cache = None
        self._rope_tables = {}
        self.invalidate_weights()

    @property
    def dtype(self) -> torch.dtype:
        return self.compute_dtype

    @property
    def device(self) -> torch.device:
        return self.embed.weight.device

    # ---- rope ------------------------------------------------------------------------------
    def _size_rope_table(self, positions: int) -> None:
        """Make the cos/sin tables (one per RoPE layer type) cover positions 0 … ``positions`` − 1."""
        tables = self._rope_tables
        if tables and next(iter(tables.values()))[0].shape[0] >= positions:
            return
        ids = torch.arange(positions, device=self.device)[None]
        probe = torch.empty(0, dtype=self.dtype, device=self.device)
        for rope_type in dict.fromkeys(self.spec.rope_types):
            cos, sin = self.rotary(probe, ids) if rope_type is None else self.rotary(probe, ids, rope_type)
            half = sin.shape[-1] // 2
            tables[rope_type] = (cos[0], torch.cat((-sin[0, :, :half], sin[0, :, half:]), dim=-1))

    def _rope_rows(self, positions: torch.Tensor) -> dict[str | None, tuple[torch.Tensor, torch.Tensor]]:
        """Per RoPE layer type, cos/sin rows for ``positions`` (any shape) → (*positions.shape, head_dim)."""
        self._size_rope_table(int(positions.max()) + 1)
        return {kind: (cos[positions], sin[positions]) for kind, (cos, sin) in self._rope_tables.items()}

    # ---- forward ---------------------------------------------------------------------------
    def prefill(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor, max_len: int
    ) -> torch.Tensor:
        """Run the prompts (B, P), left-padded; allocate a cache of ``max_len`` columns.

        Returns float32 logits of the last prompt position, (B, V). A prefix shared by all
        rows (≥ ``_MIN_SHARED_PREFIX`` tokens) is run once, as one row, into cache columns
        0 … k−1 of every row; the rest of each prompt follows, left-padded, attending to it.
        Keys carry their RoPE positions, so this column order changes nothing downstream.
        """
        self.refresh_weights()
        rows, plen = input_ids.shape
        if max_len < plen:
            raise ValueError(f"max_len {max_len} is shorter than the prompt length {plen}")
        cache = self.cache = KVCache(
            len(self.layers), rows, self.kv_heads, max_len, self.head_dim, self.cache_dtype, self.device
        )
        self._size_rope_table(int(position_ids.max()) + 1 + max_len - plen)
        # Shared fp32 weights promise HF's exact computation, which a batch-of-one prefix breaks.
        prefix = 0 if self.hf_numerics else shared_prefix_length(input_ids, attention_mask, position_ids)
        if prefix < _MIN_SHARED_PREFIX:
            x = self._prefill_block(cache, input_ids, attention_mask.bool(), position_ids, 0)
            cache.set_prompt_mask(attention_mask.bool())
            cache.length = plen
            return self._logits(x[:, -1])
        # 1) the prefix, taken from row 0, into columns 0 … k−1 of every row
        first = plen - int(attention_mask[0].sum())
        prefix_positions = torch.arange(prefix, device=self.device)[None]
        prefix_valid = torch.ones_like(prefix_positions, dtype=torch.bool)
        self._prefill_block(cache, input_ids[:1, first : first + prefix], prefix_valid, prefix_positions, 0)
        cache.key_valid[:, :prefix] = True
        # 2) each row's own tokens, left-padded to the longest, into the next columns
        lengths = torch.full((rows,), prefix, device=self.device)
        return self._prefill_after_prefix(cache, input_ids, attention_mask, position_ids, lengths, prefix)

    def _prefill_after_prefix(
        self,
        cache: KVCache,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        position_ids: torch.Tensor,
        prefix_lengths: torch.Tensor,
        start: int,
    ) -> torch.Tensor:
        """Each row's tokens after its first ``prefix_lengths[i]``, which cache columns < ``start``
        already hold (right-aligned, ``key_valid``/``key_pos`` set), left-padded to the longest,
        into the next columns; the float32 logits of each row's last token."""
        plen = input_ids.shape[1]
        own = attention_mask.sum(dim=1) - prefix_lengths
        width = int(own.max())
        valid = torch.arange(width, device=self.device)[None] >= (width - own)[:, None]
        x = self._prefill_block(cache, input_ids[:, plen - width :], valid, position_ids[:, plen - width :], start)
        cache.set_prompt_mask(torch.cat([cache.key_valid[:, :start], valid], dim=1))
        cache.length = start + width
        return self._logits(x[:, -1])

    def join(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        position_ids: torch.Tensor,
        extra_columns: int,
        prefixes: list[tuple[int | None, int]] | None = None,
    ) -> tuple[torch.Tensor, int]:
        """Prefill new prompts (B, P), left-padded, as cache rows after the running ones.

        The running rows keep their keys and values (no recompute); both sets are right-aligned
        at the longer written length (:meth:`KVCache.joined`) with ``extra_columns`` free columns
        for the decode steps to come. ``prefixes[i] = (row, k)``: new prompt i starts with the
        first ``k`` tokens that cache row ``row`` has already run (an agent's earlier turn, or a
        system prompt another trajectory shares), so their keys and values are copied from that
        row and only the rest of the prompt runs. A prefix is not copied with HF's numerics
        (shared fp32 weights), which a copy would break, nor when the row does not hold exactly
        those positions. Returns the float32 logits of the new rows' last prompt position,
        (B, V), and the number of prompt tokens copied instead of run.
        """
        running = self.cache
        if running is None:
            raise RuntimeError("join() before prefill()")
        copies = [
            running.prefix_columns(row, k) if row is not None and k > 0 and not self.hf_numerics else None
            for row, k in (prefixes or [(None, 0)] * len(input_ids))
        ]
        lengths = [0 if kv is None else kv.shape[3] for kv in copies]
        start = max(lengths)
        if start == 0:
            logits = self.prefill(input_ids, attention_mask, position_ids, input_ids.shape[1])
            fresh = self.cache
        else:
            self.refresh_weights()
            lengths_t = torch.tensor(lengths, device=self.device)
            width = int((attention_mask.sum(dim=1) - lengths_t).max())
            fresh = KVCache(
                len(self.layers),
                len(input_ids),
                self.kv_heads,
                start + width,
                self.head_dim,
                self.cache_dtype,
                self.device,
            )
            fresh.data[:, :, :, :, :start].zero_()  # the left padding of shorter prefixes
            for i, kv in enumerate(copies):
                if kv is not None:
                    k = kv.shape[3]
                    fresh.data[:, :, i, :, start - k : start] = kv
                    fresh.key_pos[i, start - k : start] = torch.arange(k, device=self.device)
                    fresh.key_valid[i, start - k : start] = True
            logits = self._prefill_after_prefix(fresh, input_ids, attention_mask, position_ids, lengths_t, start)
        if fresh is None:
            raise RuntimeError("join(): the new rows' prefill left no cache")
        self._size_rope_table(int(position_ids.max()) + 1 + extra_columns)
        self.cache = running.joined(fresh, extra_columns)
        return logits, sum(lengths)

    def _prefill_block(
        self, cache: KVCache, input_ids: torch.Tensor, valid: torch.Tensor, position_ids: torch.Tensor, start: int
    ) -> torch.Tensor:
        """Run tokens (b, n) into cache columns ``start`` … ``start + n − 1``; hidden states out.

        Each token attends to the valid columns < ``start`` (already filled, their ``key_valid``
        and ``key_pos`` set) and causally to the valid tokens of its own block; in a
        sliding-window layer only to keys less than the window behind it in position. ``b`` = 1
        fills the columns of every cache row.
        """
        n = input_ids.shape[1]
        causal = torch.ones(n, n, dtype=torch.bool, device=self.device).tril()
        # A padding query attends to itself only, so no row of the softmax is empty (NaN).
        mask = (causal & valid[:, None, :]) | torch.eye(n, dtype=torch.bool, device=self.device)
        key_pos = position_ids
        if start:
            mask = torch.cat([cache.key_valid[:, None, :start].expand(-1, n, -1), mask], dim=2)
            key_pos = torch.cat([cache.key_pos[:, :start], position_ids], dim=1)
        cache.key_pos[:, start : start + n] = position_ids
        masks: dict[int | None, torch.Tensor] = {None: mask[:, None]}
        for window in self._windows():
            recent = key_pos[:, None, :] > position_ids[:, :, None] - window
            masks[window] = (mask & recent)[:, None]
        rope = {kind: (cos[:, :, None], sin[:, :, None]) for kind, (cos, sin) in self._rope_rows(position_ids).items()}
        x = self._embed(input_ids)
        for index, layer in enumerate(self.layers):
            x = self._prefill_layer(cache, index, layer, x, rope[layer.rope_type], masks[layer.window], start)
        return x

    def _windows(self) -> set[int]:
        return {window for window in self.spec.windows if window is not None}

    def _embed(self, ids: torch.Tensor) -> torch.Tensor:
        x = F.embedding(ids, self.embed.weight)
        if self.embed_scale is not None:  # Gemma: × √hidden, in the embedding's dtype (as HF)
            x = x * self.embed_scale.to(x.dtype)
        return x.to(self.compute_dtype)

    def _qk(self, layer: _Layer, qk: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        """Queries and keys (..., heads + kv, head_dim): the per-head q/k norms if any, then RoPE."""
        if self.spec.qk_norm:
            heads, kv = self.num_heads, self.kv_heads
            weight = torch.cat([layer.w["q_norm"].expand(heads, -1), layer.w["k_norm"].expand(kv, -1)])
            qk = self.norm(qk, weight, self.eps)
        return _rope(qk, *rope)

    def _prefill_layer(
        self,
        cache: KVCache,
        index: int,
        layer: _Layer,
        x: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor],
        mask: torch.Tensor,
        start: int,
    ) -> torch.Tensor:
        rows, n, _ = x.shape
        heads, kv = self.num_heads, self.kv_heads
        h = self.norm(x, layer.w["input_layernorm"], self.eps)
        qkv = layer.qkv(h).view(rows, n, heads + 2 * kv, self.head_dim)
        qk = self._qk(layer, qkv[:, :, : heads + kv], rope)
        q = qk[:, :, :heads].transpose(1, 2)
        k = qk[:, :, heads:].transpose(1, 2)
        v = qkv[:, :, heads + kv :].transpose(1, 2)
        keys, values = cache.keys(index), cache.values(index)
        keys[:, :, start : start + n] = k
        values[:, :, start : start + n] = v
        if start:  # attend to the shared prefix in the cache too
            q = q.to(self.cache_dtype)
            k, v = keys[:, :, : start + n], values[:, :, : start + n]
        attn = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=heads != kv, scale=self.spec.scale)
        attn = attn.to(self.compute_dtype).transpose(1, 2).reshape(rows, n, heads * self.head_dim)
        return self._attention_out_and_mlp(layer, attn, x)

    def _attention_out_and_mlp(self, layer: _Layer, attn: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """The attention output projection and the MLP, each added to the residual stream.

        Llama family: x + down(silu(gate(h)) ⊙ up(h)), h = rms(x), three matmuls with fused
        epilogues. Gemma: each block's output is normed before the residual add, and the MLP is
        GeGLU between a pre- and a post-norm.
        """
        w = layer.w
        if not self.spec.gemma:
            x = layer.o.plus(attn, x)
            h = self.norm(x, w["post_attention_layernorm"], self.eps)
            return layer.down.plus(layer.up.times(h, layer.gate.silu(h)), x)
        x = x + self.norm(layer.o(attn), w["post_attention_layernorm"], self.eps)
        h = self.norm(x, w["pre_feedforward_layernorm"], self.eps)
        mlp = layer.down(layer.up.times(h, layer.gate.gelu_tanh(h)))
        return x + self.norm(mlp, w["post_feedforward_layernorm"], self.eps)

    def decode(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """One step for every cache row: ``tokens``, ``positions`` (rows,) → float32 logits (rows, V)."""
        cache = self.cache
        if cache is None:
            raise RuntimeError("decode() before prefill()")
        col = cache.length
        if col >= cache.max_len:
            raise RuntimeError(f"KV cache full ({cache.max_len} columns)")
        rope = {kind: (cos[:, None], sin[:, None]) for kind, (cos, sin) in self._rope_rows(positions).items()}
        cache.key_pos[:, col] = positions
        # Without padding no mask is needed; that SDPA call is also the one HF makes, so the
        # numerics match its decode step bit for bit.
        full = None if cache.no_padding else cache.key_valid[:, None, None, : col + 1]
        masks: dict[int | None, torch.Tensor | None] = {None: full}
        for window in self._windows():
            windowed = cache.window_mask(positions, window, col + 1)
            masks[window] = None if full is None and bool(windowed.all()) else windowed
        if not self.hf_numerics:
            masks = _additive_masks(masks, self.kv_heads)
        x = self._embed(tokens)
        for index, layer in enumerate(self.layers):
            x = self._decode_layer(cache, index, layer, x, rope[layer.rope_type], masks[layer.window], col)
        cache.length = col + 1
        return self._logits(x)

    def _decode_layer(
        self,
        cache: KVCache,
        index: int,
        layer: _Layer,
        x: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor],
        mask: torch.Tensor | None,
        col: int,
    ) -> torch.Tensor:
        rows = x.shape[0]
        heads, kv, hd = self.num_heads, self.kv_heads, self.head_dim
        h = self.norm(x, layer.w["input_layernorm"], self.eps)
        qkv = layer.qkv(h).view(rows, heads + 2 * kv, hd)
        qk = self._qk(layer, qkv[:, : heads + kv], rope)
        keys, values = cache.keys(index), cache.values(index)
        keys[:, :, col] = qk[:, heads:]
        values[:, :, col] = qkv[:, heads + kv :]
        keys, values = keys[:, :, : col + 1], values[:, :, : col + 1]
        scale = self.spec.scale
        if self.hf_numerics and mask is None:
            # HF's own call when nothing is padded: same numerics as its decode step.
            q = qk[:, :heads, None]
            attn = F.scaled_dot_product_attention(q, keys, values, enable_gqa=heads != kv, scale=scale)
        else:
            # The g query heads sharing a key/value head become g query rows of that head.
            q = qk[:, :heads].reshape(rows, kv, heads // kv, hd).to(self.cache_dtype)
            if self.hf_numerics:  # ``mask`` boolean (rows, 1, 1, L)
                attn = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=scale)
            else:  # ``mask`` the step's additive bias (rows · kv, 1, L)
                attn = _decode_attention(q, keys, values, mask, scale)
            attn = attn.to(self.compute_dtype)
        return self._attention_out_and_mlp(layer, attn.reshape(rows, heads * hd), x)

    def _logits(self, x: torch.Tensor) -> torch.Tensor:
        logits = self.lm_head(self.norm(x, self.w_final, self.eps))
        cap = self.spec.final_softcap
        if cap is not None:  # Gemma: cap · tanh(logits / cap), in the logits' dtype (as HF)
            logits = torch.tanh(logits / cap) * cap
        return logits.float()

    def select_rows(self, index: torch.Tensor) -> None:
        """Keep/repeat cache rows (drop finished sequences, or fan a prompt out to n samples)."""
        if self.cache is None:
            raise RuntimeError("select_rows() before prefill()")
        self.cache.select_rows(index)
