"""Model forward passes over a micro-batch of rollout rows, returning response-token outputs.

A row is ``input_ids = [prompt (left-padded, P) | response (right-padded, T)]``. Token t of
the response is predicted at position ``P − 1 + t``, so log-probs, entropies and values
come from positions ``P − 1 … P + T − 2``.

Padding costs compute, so each micro-batch is first cut to the columns that hold a real
token in some row (left padding common to all prompts, right padding beyond the longest
response), less the last one, which predicts nothing. Real tokens never attend to padding,
so this changes no output; positions come from ``position_ids`` and are unaffected. Outputs
are zero wherever the attention mask is 0 and are padded back to width T, so they do not
depend on how rows were grouped. Only the response positions go through the LM head
(``logits_to_keep``), which matters for a 49k-token vocabulary; when their float32 logits
would reach ``CHUNKED_HEAD_MIN_BYTES`` (a 262k-token vocabulary) the head runs a chunk of rows
at a time from the hidden states instead (:mod:`hybridflow.engine.chunked_lm_head`). Rows that repeat a prompt
(n samples per prompt) run it once per batch (:mod:`hybridflow.engine.shared_prompt`).

A model loaded with ``use_remove_padding`` (a packed attention implementation, see
:mod:`hybridflow.models.packed_attention`) runs a micro-batch without any padding instead:
every row's real tokens back to back in one row, positions restarting per row, attention
inside each row only (the segment boundaries go to the model as ``cu_seq_lens_q``). The
outputs are the same up to float rounding. A micro-batch that shares prompt keys and values
(``prompt_cache``) keeps the padded layout: its prompts are already computed once per batch.

Vision-language rows (Qwen2-VL) carry their image tensors (``multi_modal_inputs``) and 3-D
positions (b, 3, L); the padded path gives the model the micro-batch's image tensors in row
order and the positions as (3, b, columns) (:mod:`hybridflow.engine.multimodal_inputs`). Such
micro-batches are never packed, and their prompts are not shared across rows (equal prompt
ids can hold other images); the chunked LM head does not know Qwen2-VL's head, so the plain
head runs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import torch
import torch.nn.functional as F
from tensordict import TensorDict

from hybridflow import fields as FK
from hybridflow.algorithms.utils import (
    entropy_from_logits,
    entropy_from_logits_chunked,
    logprobs_from_logits,
)
from hybridflow.engine.chunked_lm_head import LMHead, capture_head_log_probs, find_lm_head
from hybridflow.engine.fused_log_probs import token_log_probs
from hybridflow.engine.multimodal_inputs import (
    check_image_tokens,
    image_model_kwargs,
    is_multimodal,
    log_step_aside,
    model_position_ids,
)
from hybridflow.models.packed_attention import PACKED_PREFIX


class PromptKeysValues(Protocol):
    """A micro-batch's view of the batch's prompt cache (``shared_prompt.PromptRows``)."""

    def dynamic_cache(self, start: int) -> Any: ...


@dataclass(frozen=True)
class Window:
    """Columns ``[lo, hi)`` of the micro-batch that are kept; P = prompt width, T = response width."""

    lo: int
    hi: int
    prompt_len: int
    response_len: int

    @property
    def n_response(self) -> int:
        """Response positions inside the window (``hi − P``, at least 1)."""
        return self.hi - self.prompt_len


def compute_position_ids(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions counted over real tokens only: cumsum(mask) − 1, clamped at 0. (B, L) → (B, L)."""
    return (attention_mask.long().cumsum(dim=-1) - 1).clamp(min=0)


def response_window(attention_mask: torch.Tensor, response_len: int) -> Window:
    """The smallest column range holding every real token, widened to include P − 1 and P."""
    total = attention_mask.shape[1]
    prompt_len = total - response_len
    if prompt_len < 1 or response_len < 1:
        raise ValueError(f"rows need a prompt and a response, got widths P={prompt_len}, T={response_len}")
    used = attention_mask.bool().any(dim=0).nonzero().flatten()
    lo = min(int(used[0]), prompt_len - 1) if used.numel() else prompt_len - 1
    hi = max(int(used[-1]) + 1, prompt_len + 1) if used.numel() else prompt_len + 1
    return Window(lo=lo, hi=hi, prompt_len=prompt_len, response_len=response_len)


def _windowed_inputs(module: torch.nn.Module, micro: TensorDict, window: Window) -> dict[str, torch.Tensor]:
    """Columns ``lo … hi − 2`` of the model inputs: the last real token predicts nothing we use.
    Image rows add their image tensors (all image tokens are prompt tokens, so inside the
    window) and 3-D positions as (3, b, columns) (:mod:`hybridflow.engine.multimodal_inputs`)."""
    attention_mask = micro[FK.ATTENTION_MASK]
    position_ids = micro[FK.POSITION_IDS] if FK.POSITION_IDS in micro.keys() else compute_position_ids(attention_mask)
    cols = slice(window.lo, window.hi - 1)
    input_ids = micro[FK.INPUT_IDS][:, cols]
    images = image_model_kwargs(micro, input_ids.device)
    check_image_tokens(module, input_ids, images)
    return {
        "input_ids": input_ids,
        "attention_mask": attention_mask[:, cols],
        "position_ids": model_position_ids(position_ids[..., cols]),
        **images,
    }


def packs_rows(module: torch.nn.Module) -> bool:
    """True when ``module`` (a causal LM, a value model, or a wrapper of one) was loaded with a
    packed attention implementation (``use_remove_padding``)."""
    config = getattr(module, "config", None) or getattr(getattr(module, "backbone", None), "config", None)
    return str(getattr(config, "_attn_implementation", "")).startswith(PACKED_PREFIX)


# A micro-batch is packed only when padding is at least this share of its padded window:
# packing removes the padding but runs attention row by row, which was slower than one batched
# kernel when rows were full (benchmarks/packing.py, docs/benchmarks.md: bf16 update 1.73–1.78 s
# packed vs 1.49–1.66 s padded with no padding; 1.25–1.32× faster packed with 18% padding).
PACK_MIN_PADDING = 0.1

# The LM head runs chunk by chunk from the hidden states (chunked_lm_head) once the float32
# logits of a micro-batch's response positions would reach this size: 1 GiB is 1024 positions
# of Gemma 3's 262k vocabulary (16 rows × 64), 5462 of SmolLM2's 49k. Below it the plain head
# is kept: the chunked backward recomputes the logits (one more head matrix product), and on
# 2 AVX2 cores SmolLM2's update at 32 × 64 (384 MiB of logits) took 1.36× as long for a peak
# only 6% lower, the layers' activations dwarfing its logits (docs/benchmarks.md).
CHUNKED_HEAD_MIN_BYTES = 1 << 30


def worth_packing(micro: TensorDict, response_len: int, min_padding: float = PACK_MIN_PADDING) -> bool:
    """Pack this micro-batch? It has a response token, and padding is ≥ ``min_padding`` of the
    (b, window) block the padded path would compute. Rows with images or 3-D positions are
    never packed: packing flattens (b, L) positions and knows nothing of image tensors."""
    if is_multimodal(micro):
        log_step_aside("use_remove_padding (packed rows)", "packing handles only (B, L) text rows; padded path used")
        return False
    mask = micro[FK.ATTENTION_MASK]
    if not bool(mask[:, -response_len:].any()):
        return False
    window = response_window(mask, response_len)
    block = mask.shape[0] * (window.hi - 1 - window.lo)
    real = int(mask.sum()) - mask.shape[0]  # each row's last token is not fed
    return real <= (1.0 - min_padding) * block


@dataclass(frozen=True)
class Packed:
    """A micro-batch as one row: ``inputs`` for the model, the flat indices ``keep`` whose
    outputs predict response tokens, and where those go back in the (b, T) layout."""

    inputs: dict[str, torch.Tensor | int]
    keep: torch.Tensor  # (K,) flat positions, row by row
    rows: torch.Tensor  # (K,) the row of each kept position
    cols: torch.Tensor  # (K,) its response column
    batch: int
    response_len: int


def pack_micro_batch(micro: TensorDict, response_len: int) -> Packed:
    """Each row's real tokens but its last (which predicts nothing), concatenated."""
    mask = micro[FK.ATTENTION_MASK].bool()
    ids = micro[FK.INPUT_IDS]
    positions = micro[FK.POSITION_IDS] if FK.POSITION_IDS in micro.keys() else compute_position_ids(mask)
    prompt_width = ids.shape[1] - response_len
    response_lens = mask[:, prompt_width:].sum(dim=1)
    flat_ids, flat_pos, keep, rows, cols, bounds, offset = [], [], [], [], [], [0], 0
    for i in range(ids.shape[0]):
        n_resp = int(response_lens[i])
        if n_resp == 0:  # nothing to predict: the row is left out
            continue
        real = mask[i].nonzero().flatten()[:-1]
        n_prompt = int(mask[i, :prompt_width].sum())
        flat_ids.append(ids[i, real])
        flat_pos.append(positions[i, real])
        keep.append(torch.arange(offset + n_prompt - 1, offset + n_prompt - 1 + n_resp))
        rows.append(torch.full((n_resp,), i))
        cols.append(torch.arange(n_resp))
        offset += real.numel()
        bounds.append(offset)
    if not flat_ids:
        raise ValueError("pack_micro_batch: no row of this micro-batch has a response token")
    device = ids.device
    total = offset
    cu = torch.tensor(bounds, dtype=torch.int32, device=device)
    longest = int((cu[1:] - cu[:-1]).max())
    inputs: dict[str, torch.Tensor | int] = {
        "input_ids": torch.cat(flat_ids)[None],
        "position_ids": torch.cat(flat_pos)[None],
        # all ones: no padding to mask, and HF then builds no dense mask of the packed row
        "attention_mask": torch.ones(1, total, dtype=torch.long, device=device),
        "cu_seq_lens_q": cu,
        "cu_seq_lens_k": cu,
        "max_length_q": longest,
        "max_length_k": longest,
    }
    cat = lambda parts: torch.cat(parts).to(device)  # noqa: E731
    return Packed(inputs, cat(keep), cat(rows), cat(cols), ids.shape[0], response_len)


def unpack(x: torch.Tensor, packed: Packed) -> torch.Tensor:
    """(K, ...) values of the kept positions → (b, T, ...), zero elsewhere."""
    out = x.new_zeros(packed.batch, packed.response_len, *x.shape[1:])
    return out.index_put((packed.rows, packed.cols), x)


def _finish(x: torch.Tensor, micro: TensorDict, window: Window) -> torch.Tensor:
    """Zero every non-response position (so outputs never depend on the micro-batch split)
    and pad back to the response width T. ``x``: (b, n) or (b, n, K)."""
    valid = micro[FK.ATTENTION_MASK][:, window.prompt_len : window.hi].to(x.dtype)
    if x.dim() == 3:
        return F.pad(x * valid[..., None], (0, 0, 0, window.response_len - x.shape[1]))
    return F.pad(x * valid, (0, window.response_len - x.shape[1]))


def _response_forward(
    module: torch.nn.Module, inputs: dict[str, torch.Tensor], window: Window, prompt_cache: PromptKeysValues | None
) -> Any:
    """The model's output, logits (b, hi − P, V) at positions P − 1 … hi − 2: those that
    predict a response token."""
    split = window.prompt_len - 1 - window.lo  # prompt columns before the last prompt token
    if prompt_cache is not None and split > 0:
        if inputs["position_ids"].dim() == 3 or "pixel_values" in inputs:
            raise ValueError("a prompt cache cannot serve rows with images or 3-D positions (plan_chunks steps aside)")
        # Columns lo … P−2 were run once per distinct prompt; run the rest against them.
        return module(
            input_ids=inputs["input_ids"][:, split:],
            attention_mask=inputs["attention_mask"],
            position_ids=inputs["position_ids"][:, split:],
            cache=prompt_cache.dynamic_cache(window.lo),
            use_cache=True,
        )
    # The kept positions as an index tensor, not a count: HF then gathers them into a
    # contiguous tensor, where a count gives a strided view that makes the 49k-row LM head
    # ~10× slower on CPU in bf16 (8 × 50 positions: 360 vs 38 ms).
    keep = torch.arange(split, split + window.n_response, device=inputs["input_ids"].device)
    return module(**inputs, use_cache=False, logits_to_keep=keep)


def response_log_probs(
    module: torch.nn.Module,
    micro: TensorDict,
    temperature: float = 1.0,
    calculate_entropy: bool = False,
    chunked_entropy: bool = False,
    calculate_sum_pi_squared: bool = False,
    entropy_requires_grad: bool = True,
    prompt_cache: PromptKeysValues | None = None,
    topk: int = 0,
    gather_ids_key: str | None = None,
) -> dict[str, torch.Tensor]:
    """``{"log_probs": (b, T)[, "entropy": (b, T)][, "sum_pi_squared": (b, T)]}`` of the
    response tokens under ``module`` (and ``topk_log_probs`` / ``topk_ids``, see below).

    log π(y_t) = log softmax(z_t / τ)[y_t] with τ = ``temperature`` (the sampling
    temperature), computed in float32; entropy of softmax(z_t / τ) (``chunked_entropy``:
    a few rows at a time, to save memory; ``entropy_requires_grad=False``: computed without a
    gradient, for the metric only). Exactly 0 where the attention mask is 0. ``prompt_cache``:
    the keys and values of these rows' prompts, already computed for the whole batch
    (:mod:`hybridflow.engine.shared_prompt`; the engine passes it).

    Distillation: ``topk`` > 0 adds the model's own ``topk`` largest log-probs per position,
    ``topk_log_probs`` (b, T, K) and their ``topk_ids`` (b, T, K, int64); ``gather_ids_key``
    names a (b, T, K) id column of ``micro`` (a teacher's top-K ids) at which the
    ``topk_log_probs`` are gathered instead (differentiable). Both take the full-vocabulary
    log-softmax of these rows.
    """
    call = _model_call(module, micro, prompt_cache, gather_ids_key)
    labels, finish = call.labels, call.finish
    if topk > 0 or call.gather_ids is not None:
        logits, ids = call.run().logits, call.gather_ids
        return _full_log_softmax_outputs(
            logits, labels, temperature, finish, topk, ids, calculate_entropy, entropy_requires_grad
        )
    entropy_needs_grad = calculate_entropy and entropy_requires_grad and torch.is_grad_enabled()
    if not (entropy_needs_grad or calculate_sum_pi_squared):
        return _fused_outputs(module, call, temperature, calculate_entropy)
    logits = call.run().logits.float()  # the low-precision logits are a temporary, freed before the ops below
    return _float32_outputs(
        logits,
        labels,
        temperature,
        finish,
        calculate_entropy,
        chunked_entropy,
        calculate_sum_pi_squared,
        entropy_requires_grad,
    )


def _fused_outputs(
    module: torch.nn.Module, call: _ModelCall, temperature: float, calculate_entropy: bool
) -> dict[str, torch.Tensor]:
    """The common case of :func:`response_log_probs`: one fused pass per chunk of rows
    (fused_log_probs, chunked_lm_head), never holding the whole batch's float32 logits."""
    log_probs, entropy = _token_log_probs(module, call, temperature, calculate_entropy)
    result = {"log_probs": call.finish(log_probs)}
    if entropy is not None:
        result["entropy"] = call.finish(entropy)
    return result


@dataclass(frozen=True)
class _ModelCall:
    """A micro-batch's model call, not yet run: ``run()`` returns the model's output (logits
    at the response positions), ``labels`` the tokens those positions predict, ``gather_ids``
    the ``gather_ids_key`` column at them, and ``finish`` maps a per-position output back to
    (b, T), zero on padding."""

    run: Callable[[], Any]
    labels: torch.Tensor
    gather_ids: torch.Tensor | None
    finish: Callable[[torch.Tensor], torch.Tensor]


def _model_call(
    module: torch.nn.Module, micro: TensorDict, prompt_cache: PromptKeysValues | None, gather_ids_key: str | None
) -> _ModelCall:
    """Packed rows when the module packs and it pays; else the micro-batch cut to its window."""
    responses = micro[FK.RESPONSES]
    gather_ids = micro[gather_ids_key] if gather_ids_key is not None else None
    if prompt_cache is None and packs_rows(module) and worth_packing(micro, responses.shape[1]):
        packed = pack_micro_batch(micro, responses.shape[1])
        return _ModelCall(
            run=lambda: module(**packed.inputs, use_cache=False, logits_to_keep=packed.keep),
            labels=responses[packed.rows, packed.cols][None],
            gather_ids=gather_ids[packed.rows, packed.cols][None] if gather_ids is not None else None,
            finish=lambda x: unpack(x[0], packed),
        )
    window = response_window(micro[FK.ATTENTION_MASK], responses.shape[1])
    inputs = _windowed_inputs(module, micro, window)
    return _ModelCall(
        run=lambda: _response_forward(module, inputs, window, prompt_cache),
        labels=responses[:, : window.n_response],
        gather_ids=gather_ids[:, : window.n_response] if gather_ids is not None else None,
        finish=lambda x: _finish(x, micro, window),
    )


def chunked_head(module: torch.nn.Module, rows: int) -> LMHead | None:
    """The LM head to run chunk by chunk (:mod:`hybridflow.engine.chunked_lm_head`) for
    ``rows`` response positions, or None for the plain path: the model's head is not one the
    chunked path knows, or the float32 logits would be under ``CHUNKED_HEAD_MIN_BYTES``."""
    head = find_lm_head(module)
    if head is None or rows * head.vocab_size * 4 < CHUNKED_HEAD_MIN_BYTES:
        return None
    return head


def _token_log_probs(
    module: torch.nn.Module, call: _ModelCall, temperature: float, with_entropy: bool
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs (and the entropy metric) of ``call.labels``: from the hidden states chunk by
    chunk when :func:`chunked_head` says so, else from the model's logits."""
    head = chunked_head(module, call.labels.numel())
    if head is None:
        return token_log_probs(call.run().logits, call.labels, temperature, with_entropy=with_entropy)
    with capture_head_log_probs(head, call.labels, temperature, with_entropy) as capture:
        output = call.run()
    return capture.result(output.logits)


def _float32_outputs(
    logits: torch.Tensor,
    labels: torch.Tensor,
    temperature: float,
    finish: Callable[[torch.Tensor], torch.Tensor],
    calculate_entropy: bool,
    chunked_entropy: bool,
    calculate_sum_pi_squared: bool,
    entropy_requires_grad: bool,
) -> dict[str, torch.Tensor]:
    """Log-probs (and entropy, Σ π²) from float32 ``logits``, each op separately: the path when
    the entropy needs its gradient or Σ π² is asked for."""
    result = {"log_probs": finish(logprobs_from_logits(logits, labels, temperature))}
    if calculate_entropy:
        # Entropy only as a metric (entropy_coeff = 0) needs no autograd graph over the logits.
        with torch.set_grad_enabled(entropy_requires_grad and torch.is_grad_enabled()):
            if chunked_entropy:
                entropy = entropy_from_logits_chunked(logits, temperature=temperature)
            else:
                entropy = entropy_from_logits(logits, temperature)
        result["entropy"] = finish(entropy)
    if calculate_sum_pi_squared:  # Σ_v π_v², for the optimal-token-baseline estimators
        probs = torch.softmax(logits / temperature, dim=-1)
        result["sum_pi_squared"] = finish(probs.square().sum(-1))
    return result


def _full_log_softmax_outputs(
    logits: torch.Tensor,
    labels: torch.Tensor,
    temperature: float,
    finish: Any,
    topk: int,
    gather_ids: torch.Tensor | None,
    calculate_entropy: bool,
    entropy_requires_grad: bool,
) -> dict[str, torch.Tensor]:
    """Log-probs of ``labels`` plus top-K (own or gathered at ``gather_ids``) from one
    float32 log-softmax over the vocabulary."""
    log_softmax = torch.log_softmax(logits.float() / temperature, dim=-1)
    result = {"log_probs": finish(log_softmax.gather(-1, labels[..., None])[..., 0])}
    if gather_ids is not None:
        if gather_ids.numel() and int(gather_ids.max()) >= log_softmax.shape[-1]:
            raise ValueError(
                f"top-K token id {int(gather_ids.max())} is outside this model's vocabulary of "
                f"{log_softmax.shape[-1]} logits (was the teacher's vocabulary larger?)"
            )
        result["topk_log_probs"] = finish(log_softmax.gather(-1, gather_ids))
    elif topk > 0:
        if topk > log_softmax.shape[-1]:
            raise ValueError(f"top-K of {topk} exceeds the model's vocabulary of {log_softmax.shape[-1]}")
        values, ids = log_softmax.topk(topk, dim=-1)
        result["topk_log_probs"], result["topk_ids"] = finish(values), finish(ids)
    if calculate_entropy:
        with torch.set_grad_enabled(entropy_requires_grad and torch.is_grad_enabled()):
            result["entropy"] = finish(-(log_softmax.exp() * log_softmax).sum(-1))
    return result


def response_values(module: torch.nn.Module, micro: TensorDict) -> dict[str, torch.Tensor]:
    """``{"values": (b, T)}``: the critic's V at the positions that predict each response token."""
    responses = micro[FK.RESPONSES]
    if packs_rows(module) and worth_packing(micro, responses.shape[1]):
        packed = pack_micro_batch(micro, responses.shape[1])
        values = module(**packed.inputs)[0, packed.keep]  # (K,)
        return {"values": unpack(values.float(), packed)}
    window = response_window(micro[FK.ATTENTION_MASK], responses.shape[1])
    values = module(**_windowed_inputs(module, micro, window))  # (b, hi − 1 − lo)
    start = window.prompt_len - 1 - window.lo
    values = values[:, start : start + window.n_response]
    return {"values": _finish(values.float(), micro, window)}
