"""Tensor helpers shared by the algorithm functions (masked statistics, log-probs, entropy).

Shapes: ``B`` rows, ``T`` response tokens, ``V`` vocabulary size. A *mask* is a (B, T) tensor
of 0/1 (bool, int or float); statistics only read positions where it is non-zero, so NaN or
garbage at masked-out positions never leaks into a result.
"""

from __future__ import annotations

import torch

# Added to denominators of masked means, as verl does, so an all-zero mask gives 0, not NaN.
MASK_EPS = 1e-8
# Row chunk used by the memory-friendly log-prob / entropy paths.
DEFAULT_CHUNK_ROWS = 2048


def masked_sum(values: torch.Tensor, mask: torch.Tensor, axis: int | tuple[int, ...] | None = None) -> torch.Tensor:
    """Σ values·mask over ``axis`` (all elements if None); NaN/inf outside the mask is ignored.

    ``torch.where`` first replaces unmasked entries by 0 so that ``nan * 0`` cannot poison the sum
    (and their gradient is exactly 0).
    """
    valid = torch.where(mask.bool(), values, torch.zeros((), dtype=values.dtype, device=values.device))
    return (valid * mask).sum(dim=axis)


def masked_mean(values: torch.Tensor, mask: torch.Tensor, axis: int | tuple[int, ...] | None = None) -> torch.Tensor:
    """masked_mean(x, m) = Σ x·m / (Σ m + 1e-8); an all-zero mask gives 0."""
    return masked_sum(values, mask, axis) / (mask.sum(dim=axis) + MASK_EPS)


def masked_var(values: torch.Tensor, mask: torch.Tensor, unbiased: bool = True) -> torch.Tensor:
    """Variance over all masked elements: masked_mean((x − μ)², m), times N/(N−1) if ``unbiased``.

    Raises ValueError when ``unbiased`` and the mask holds fewer than 2 elements (the Bessel
    factor is undefined). Reads the element count on the host (one sync).
    """
    mean = masked_mean(values, mask)
    variance = masked_mean((values - mean) ** 2, mask)
    if unbiased:
        count = mask.sum()
        n = float(count)
        if n == 0:
            raise ValueError("masked_var: the mask selects no element; at least 2 are needed")
        if n == 1:
            raise ValueError("masked_var: the mask selects one element; the unbiased variance needs 2")
        variance = variance * (count / (count - 1))
    return variance


def masked_whiten(values: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True) -> torch.Tensor:
    """(x − μ) / sqrt(σ² + 1e-8) with μ, σ² = masked mean / unbiased variance over the whole batch.

    With ``shift_mean=False`` the mean is added back after scaling. When the mask selects fewer
    than 2 elements there is no spread to normalise by, and the result is all zeros (verl raises
    instead; returning zeros lets an all-empty batch pass through estimators as "no signal").
    Output shape = ``values.shape``.
    """
    if float(mask.sum()) < 2:
        return torch.zeros_like(values)
    mean = masked_mean(values, mask)
    var = masked_var(values, mask)
    whitened = (values - mean) * torch.rsqrt(var + MASK_EPS)
    if not shift_mean:
        whitened = whitened + mean
    return whitened


def get_response_mask(
    response_id: torch.Tensor, eos_token: int | list[int] = 2, dtype: torch.dtype = torch.int64
) -> torch.Tensor:
    """(B, T) mask that is 1 up to and including the first EOS of each row, 0 after it.

    ``eos_token`` may be one id or a list of ids (any of them ends the response). A row with no
    EOS is all ones.
    """
    eos = torch.as_tensor(eos_token, device=response_id.device)
    is_eos = torch.isin(response_id, eos).int()
    # Number of EOS strictly before t: 0 for every token up to and including the first EOS.
    eos_before = is_eos.cumsum(dim=-1) - is_eos
    return eos_before.eq(0).to(dtype)


def compute_response_mask(responses: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """Response part of the attention mask: ``attention_mask[:, -T:]`` with T = responses.size(1).

    ``attention_mask`` covers prompt + response (B, P + T); the result is (B, T).
    """
    if responses.dim() != 2 or attention_mask.dim() != 2:
        raise ValueError(
            f"compute_response_mask expects 2-D tensors, got responses {tuple(responses.shape)} "
            f"and attention_mask {tuple(attention_mask.shape)}"
        )
    response_length = responses.size(1)
    if attention_mask.size(1) < response_length:
        raise ValueError(
            f"attention_mask has {attention_mask.size(1)} columns, fewer than the {response_length} response tokens"
        )
    return attention_mask[:, -response_length:]


def _scale_by_temperature(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    return logits if temperature == 1.0 else logits / temperature


def logprobs_from_logits(logits: torch.Tensor, labels: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """log softmax(z / τ)[label] for each position: logits (..., V), labels (...) → (...).

    Computed as z_label − logsumexp(z), row-chunked so the (…, V) log-softmax is never
    materialised at once. Low-precision logits (bf16/fp16) are upcast to float32 per chunk,
    because logsumexp in bf16 loses the small differences that log-probs are made of.
    """
    logits = _scale_by_temperature(logits, temperature)
    flat_logits = logits.reshape(-1, logits.shape[-1])
    flat_labels = labels.reshape(-1)
    if flat_logits.shape[0] != flat_labels.shape[0]:
        raise ValueError(f"logits {tuple(logits.shape)} and labels {tuple(labels.shape)} disagree on the leading dims")
    out_dtype = torch.promote_types(logits.dtype, torch.float32)
    pieces = []
    for start in range(0, flat_logits.shape[0], DEFAULT_CHUNK_ROWS):
        chunk = flat_logits[start : start + DEFAULT_CHUNK_ROWS].to(out_dtype)
        chunk_labels = flat_labels[start : start + DEFAULT_CHUNK_ROWS]
        picked = chunk.gather(-1, chunk_labels.unsqueeze(-1)).squeeze(-1)
        pieces.append(picked - torch.logsumexp(chunk, dim=-1))
    if not pieces:
        return torch.zeros(labels.shape, dtype=out_dtype, device=logits.device)
    return torch.cat(pieces).reshape(labels.shape)


def entropy_from_logits(logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """Entropy of softmax(z / τ): H = logsumexp(z) − Σ_v softmax(z)_v · z_v; (..., V) → (...)."""
    logits = _scale_by_temperature(logits, temperature)
    probs = torch.softmax(logits, dim=-1)
    return torch.logsumexp(logits, dim=-1) - (probs * logits).sum(dim=-1)


def entropy_from_logits_chunked(
    logits: torch.Tensor, chunk_size: int = DEFAULT_CHUNK_ROWS, temperature: float = 1.0
) -> torch.Tensor:
    """Same value as :func:`entropy_from_logits`, computed ``chunk_size`` rows at a time in float32.

    For large vocabularies the softmax of a whole (B·T, V) batch is the memory peak; chunking
    bounds it at chunk_size × V. Works on any (..., V) shape; returns (...) in float32 (or
    float64 for float64 input). Differentiable (chunks are concatenated, not written in place).
    """
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    logits = _scale_by_temperature(logits, temperature)
    flat = logits.reshape(-1, logits.shape[-1])
    out_dtype = torch.promote_types(logits.dtype, torch.float32)
    pieces = [
        entropy_from_logits(flat[start : start + chunk_size].to(out_dtype))
        for start in range(0, flat.shape[0], chunk_size)
    ]
    if not pieces:
        return torch.zeros(logits.shape[:-1], dtype=out_dtype, device=logits.device)
    return torch.cat(pieces).reshape(logits.shape[:-1])


def check_finite(name: str, tensor: torch.Tensor, mask: torch.Tensor | None = None, where: str = "") -> None:
    """Raise ValueError if ``tensor`` holds NaN/inf (only positions where ``mask`` is non-zero count).

    One host sync per call; used at entry points (advantage computation, loss aggregation), never
    inside per-token math.
    """
    bad = ~torch.isfinite(tensor)
    if mask is not None:
        bad = bad & mask.bool()
    if bool(bad.any()):
        first = [int(i) for i in bad.nonzero()[0].tolist()]
        prefix = f"{where}: " if where else ""
        raise ValueError(
            f"{prefix}{name} contains NaN/inf at {int(bad.sum())} position(s) (first at index {first}); "
            "refusing to train on non-finite numbers"
        )
