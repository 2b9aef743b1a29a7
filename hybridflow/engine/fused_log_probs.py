"""Token log-probs (and the entropy metric) over a large vocabulary in one pass per chunk.

For SmolLM2's 49k-token vocabulary the log-softmax is the largest element-wise work of an
update: written with stock ops, the forward makes a float32 copy of all logits, a softmax
and a product for the entropy, and the backward adds a zero-filled scatter (gather's
gradient) to the log-sum-exp gradient — each a full pass over (rows × V) floats. Here each
chunk of rows is upcast once, and the backward writes

    ∂ℓ_i/∂z_v = (1[v = y_i] − softmax(z_i / τ)_v) · g_i / τ

straight into a gradient in the logits' own dtype. Values are the stock formulas':

    ℓ_i = z_i[y_i]/τ − logsumexp(z_i / τ),   H_i = logsumexp(z_i/τ) − Σ_v softmax(z_i/τ)_v · z_i[v]/τ

computed with the same float32 operations as
:func:`hybridflow.algorithms.utils.logprobs_from_logits`, so the log-probs are bit-identical
to it (and to the sampler's). The entropy here is a metric: it carries no gradient.
"""

from __future__ import annotations

import torch

CHUNK_ROWS = 16  # 16 × 49k float32 = 3 MB of scratch per chunk: passes over it stay in cache


class _TokenLogProbs(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits: torch.Tensor, labels: torch.Tensor, temperature: float, with_entropy: bool):
        rows = logits.shape[0]
        log_probs = torch.empty(rows, dtype=torch.float32, device=logits.device)
        lse = torch.empty(rows, dtype=torch.float32, device=logits.device)
        entropy = torch.empty(rows if with_entropy else 0, dtype=torch.float32, device=logits.device)
        for start in range(0, rows, CHUNK_ROWS):
            end = min(start + CHUNK_ROWS, rows)
            chunk_lp, chunk_lse, chunk_entropy = chunk_forward(
                logits[start:end], labels[start:end], temperature, with_entropy
            )
            log_probs[start:end], lse[start:end] = chunk_lp, chunk_lse
            if chunk_entropy is not None:
                entropy[start:end] = chunk_entropy
        ctx.save_for_backward(logits, labels, lse)
        ctx.temperature = temperature
        ctx.mark_non_differentiable(entropy)
        return log_probs, entropy

    @staticmethod
    def backward(ctx, grad_log_probs: torch.Tensor, _grad_entropy: torch.Tensor):
        logits, labels, lse = ctx.saved_tensors
        temperature = ctx.temperature
        grad = torch.empty_like(logits)
        for start in range(0, logits.shape[0], CHUNK_ROWS):
            end = min(start + CHUNK_ROWS, logits.shape[0])
            g = grad_log_probs[start:end]
            grad[start:end] = chunk_grad(logits[start:end], labels[start:end], lse[start:end], g, temperature)
        return grad, None, None, None


def _scaled_chunk(logits: torch.Tensor, temperature: float, copy: bool = False) -> torch.Tensor:
    """``logits`` as float32 divided by τ (a new tensor when ``copy``, else maybe a view)."""
    z = logits.to(torch.float32, copy=copy and temperature == 1.0)
    # The same division as logprobs_from_logits (z / τ on float32), for identical rounding.
    return z if temperature == 1.0 else z / temperature


def chunk_forward(
    logits: torch.Tensor, labels: torch.Tensor, temperature: float, with_entropy: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """``(log π(y), logsumexp(z/τ), H or None)`` of a chunk of rows, logits (n, V) any float
    dtype, labels (n,); float32. The one formula both this module and
    :mod:`hybridflow.engine.chunked_lm_head` use, so their log-probs agree bit for bit."""
    z = _scaled_chunk(logits, temperature)
    lse = torch.logsumexp(z, dim=-1)
    log_probs = z.gather(-1, labels[:, None])[:, 0] - lse
    entropy = None
    if with_entropy:
        probs = torch.exp(z - lse[:, None])
        entropy = lse - (probs * z).sum(dim=-1)
    return log_probs, lse, entropy


def chunk_grad(
    logits: torch.Tensor,
    labels: torch.Tensor,
    lse: torch.Tensor,
    grad_log_probs: torch.Tensor,
    temperature: float,
    owned: bool = False,
) -> torch.Tensor:
    """∂(Σ g·log π(y))/∂z for a chunk of rows: (1[v = y] − softmax(z/τ)_v) · g / τ, float32.
    ``owned``: ``logits`` is a float32 scratch tensor the caller gives up (written in place)."""
    g = grad_log_probs[:, None].float()
    z = logits if owned and temperature == 1.0 else _scaled_chunk(logits, temperature, copy=True)
    chunk = z.sub_(lse[:, None]).exp_().mul_(-g)  # −softmax · g
    chunk.scatter_add_(-1, labels[:, None], g)  # + 1[v = y] · g
    if temperature != 1.0:
        chunk.div_(temperature)
    return chunk


def token_log_probs(
    logits: torch.Tensor, labels: torch.Tensor, temperature: float = 1.0, with_entropy: bool = False
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(log π(y), H or None)``, float32, of shape ``labels.shape``, for logits (..., V) in any
    float dtype and labels (...). Differentiable in the log-probs only."""
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if logits.shape[:-1] != labels.shape:
        raise ValueError(f"logits {tuple(logits.shape)} and labels {tuple(labels.shape)} disagree on the leading dims")
    flat = logits.reshape(-1, logits.shape[-1])
    if not flat.is_contiguous():
        flat = flat.contiguous()
    log_probs, entropy = _TokenLogProbs.apply(flat, labels.reshape(-1), float(temperature), with_entropy)
    return log_probs.reshape(labels.shape), (entropy.reshape(labels.shape) if with_entropy else None)
