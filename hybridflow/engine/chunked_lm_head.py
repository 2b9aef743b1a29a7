"""Token log-probs straight from the final hidden states, a chunk of rows at a time.

With a 262,144-token vocabulary (Gemma 3) one response position's logits take 1 MB in
float32, so a micro-batch of 32 × 64 response tokens makes 2.1 GB of logits, and as much
again for their gradient. Here (rows × V) never exists: each chunk of rows goes through the
LM head (``z = h W^T + b``, the model's final logit soft-capping if it has one), is reduced
to its log-prob, log-sum-exp and entropy, and is dropped. The backward recomputes each
chunk's logits from the saved hidden states and writes the gradients of the hidden states
and of the head's weight (and bias) directly: peak scratch is one chunk of logits.

The values are those of the model's own head followed by
:func:`hybridflow.engine.fused_log_probs.token_log_probs`: the same dtype rules (autocast's
compute dtype, else the parameters'), the same soft-capping operations, the same per-chunk
log-softmax code. Only the matrix product differs in how rows are grouped, which BLAS may
round differently in the last bit (float32 log-probs agree to ~1e-6, see the tests).

The head's input is taken inside the model's own forward call, by a forward pre-hook on the
LM head that computes the log-probs there and hands the head an empty input: the weight used
is the one the forward uses (FSDP's gathered copy included), and the model's tiny empty
logits output is tied into the result so that FSDP's backward hooks on it run as usual.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from hybridflow.engine.fused_log_probs import chunk_forward, chunk_grad

# Bytes of float32 logits per chunk: 128 rows of a 262k vocabulary, 682 of a 49k one. Each
# chunk reads the whole head weight (671 MB for Gemma 3 270M in float32) once per pass, so
# few large chunks are faster: on 2 AVX2 cores (262k, 512 rows, forward + backward of the
# head alone) the head took 0.39× / 0.54× / 0.61× / 0.70× of the plain path's speed with
# chunks of 32 / 64 / 128 / 256 MB. The scratch peak is a few chunks' worth.
CHUNK_BYTES = 128 << 20

# Causal LMs whose forward applies nothing to the LM head's output but (optionally)
# ``config.final_logit_softcapping`` (checked against transformers 5.25's modeling code).
_PLAIN_HEAD = frozenset({"llama", "mistral", "qwen2", "qwen3", "gemma"})
_SOFTCAPPED_HEAD = frozenset({"gemma2", "gemma3_text"})


def chunk_rows(vocab_size: int) -> int:
    """Rows per chunk: ``CHUNK_BYTES`` of float32 logits, at least 1."""
    return max(1, CHUNK_BYTES // (4 * vocab_size))


@dataclass(frozen=True)
class LMHead:
    """A causal LM's head as the chunked path needs it: the ``torch.nn.Linear`` and the
    soft-capping constant (None: none)."""

    linear: torch.nn.Linear
    softcap: float | None

    @property
    def vocab_size(self) -> int:
        return int(self.linear.out_features)


def find_lm_head(module: torch.nn.Module) -> LMHead | None:
    """The LM head of ``module`` (a causal LM, a ``peft.PeftModel`` of one, FSDP-wrapped or
    not), or None when the chunked path does not know the model's head: an unlisted model
    type, or a head that is not a plain ``torch.nn.Linear`` (a LoRA-adapted head)."""
    base = getattr(module, "get_base_model", None)
    model: Any = base() if callable(base) else module
    config = getattr(model, "config", None)
    model_type = getattr(config, "model_type", None)
    if model_type not in _PLAIN_HEAD | _SOFTCAPPED_HEAD or not hasattr(model, "get_output_embeddings"):
        return None
    head = model.get_output_embeddings()
    if type(head) is not torch.nn.Linear:
        return None
    softcap = getattr(config, "final_logit_softcapping", None) if model_type in _SOFTCAPPED_HEAD else None
    return LMHead(head, None if softcap is None else float(softcap))


def _head_logits(
    hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, softcap: float | None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(logits, tanh term or None)`` of a chunk, with the Gemma modeling code's operations."""
    logits = F.linear(hidden, weight, bias)
    if softcap is None:
        return logits, None
    tanh = torch.tanh(logits / softcap)
    return tanh * softcap, tanh


class _HeadLogProbs(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, bias, labels, temperature, softcap, with_entropy, dtype, hidden_only):
        rows, step = hidden.shape[0], chunk_rows(weight.shape[0])
        device = hidden.device
        log_probs = torch.empty(rows, dtype=torch.float32, device=device)
        lse = torch.empty(rows, dtype=torch.float32, device=device)
        entropy = torch.empty(rows if with_entropy else 0, dtype=torch.float32, device=device)
        # hidden_only: ∂ℓ_i/∂h_i = g_i · u_i with u_i known now, so keep u (rows × H) and skip
        # the backward's recomputation of the logits (the head's weight is frozen: LoRA).
        direction = torch.empty_like(hidden) if hidden_only else None
        w, b = weight.to(dtype), (bias.to(dtype) if bias is not None else None)
        with torch.autocast(device.type, enabled=False):
            for start in range(0, rows, step):
                end = min(start + step, rows)
                logits, tanh = _head_logits(hidden[start:end].to(dtype), w, b, softcap)
                lp, chunk_lse, chunk_entropy = chunk_forward(logits, labels[start:end], temperature, with_entropy)
                log_probs[start:end], lse[start:end] = lp, chunk_lse
                if chunk_entropy is not None:
                    entropy[start:end] = chunk_entropy
                if direction is not None:
                    ones = torch.ones(end - start, dtype=torch.float32, device=device)
                    d = chunk_grad(
                        logits, labels[start:end], chunk_lse, ones, temperature, logits.dtype == torch.float32
                    )
                    direction[start:end] = _through_softcap(d.to(dtype), tanh, softcap) @ w
        ctx.save_for_backward(hidden, weight, bias, labels, lse, direction)
        ctx.settings = (temperature, softcap, dtype)
        ctx.mark_non_differentiable(entropy)
        return log_probs, entropy

    @staticmethod
    def backward(ctx, grad_log_probs, _grad_entropy):
        hidden, weight, bias, labels, lse, direction = ctx.saved_tensors
        if direction is not None:
            return grad_log_probs[:, None].to(direction.dtype) * direction, *([None] * 8)
        temperature, softcap, dtype = ctx.settings
        need_hidden, need_weight, need_bias = ctx.needs_input_grad[:3]
        w, b = weight.to(dtype), (bias.to(dtype) if bias is not None else None)
        grad_hidden = torch.empty_like(hidden) if need_hidden else None
        grad_weight = torch.zeros_like(weight) if need_weight else None
        grad_bias = torch.zeros_like(bias) if need_bias else None
        step = chunk_rows(weight.shape[0])
        with torch.autocast(hidden.device.type, enabled=False):
            for start in range(0, hidden.shape[0], step):
                end = min(start + step, hidden.shape[0])
                h = hidden[start:end].to(dtype)
                logits, tanh = _head_logits(h, w, b, softcap)
                owned = logits.dtype == torch.float32  # a scratch tensor: chunk_grad may overwrite it
                g = chunk_grad(logits, labels[start:end], lse[start:end], grad_log_probs[start:end], temperature, owned)
                g = _through_softcap(g.to(dtype), tanh, softcap)
                if grad_hidden is not None:
                    grad_hidden[start:end] = g @ w
                if grad_weight is not None:
                    _accumulate(grad_weight, g.T, h)
                if grad_bias is not None:
                    grad_bias += g.sum(dim=0)
        return grad_hidden, grad_weight, grad_bias, None, None, None, None, None, None


def _through_softcap(grad: torch.Tensor, tanh: torch.Tensor | None, softcap: float | None) -> torch.Tensor:
    """The gradient of ``softcap · tanh(x / softcap)`` applied to ``grad``, in autograd's order."""
    if softcap is None or tanh is None:
        return grad
    return torch.ops.aten.tanh_backward(grad * softcap, tanh) / softcap


def _accumulate(total: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
    """``total += a @ b``, in place when the dtypes allow it (no (V × H) temporary)."""
    if total.dtype == a.dtype:
        total.addmm_(a, b)
    else:
        total += (a @ b).to(total.dtype)


def head_log_probs(
    hidden: torch.Tensor,
    head: LMHead,
    labels: torch.Tensor,
    temperature: float = 1.0,
    with_entropy: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(log π(y), H or None)``, float32, of shape ``labels.shape``, from hidden states
    (..., H) through ``head``. Differentiable in the log-probs, towards ``hidden`` and the
    head's parameters; the entropy is a metric."""
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if hidden.shape[:-1] != labels.shape:
        raise ValueError(f"hidden states {tuple(hidden.shape)} and labels {tuple(labels.shape)} disagree")
    device_type = hidden.device.type
    weight, bias = head.linear.weight, head.linear.bias
    autocast = torch.is_autocast_enabled(device_type)
    dtype = torch.get_autocast_dtype(device_type) if autocast else weight.dtype
    flat = hidden.reshape(-1, hidden.shape[-1])
    frozen = not (weight.requires_grad or (bias is not None and bias.requires_grad))
    hidden_only = frozen and flat.requires_grad and torch.is_grad_enabled()
    args = (flat, weight, bias, labels.reshape(-1), float(temperature), head.softcap, with_entropy, dtype, hidden_only)
    log_probs, entropy = _HeadLogProbs.apply(*args)
    return log_probs.reshape(labels.shape), (entropy.reshape(labels.shape) if with_entropy else None)


@dataclass
class HeadCapture:
    """What :func:`capture_head_log_probs` computed during the model call."""

    log_probs: torch.Tensor | None = None
    entropy: torch.Tensor | None = None
    thread: int = field(default_factory=threading.get_ident)

    def result(self, empty_logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The log-probs (tied to the model's empty ``logits`` output) and the entropy."""
        if self.log_probs is None:
            raise RuntimeError("the model's forward never called its LM head")
        # Adds an exact 0 with a gradient path through the model's own output, so hooks that
        # FSDP registers on that output (unshard, the end-of-backward callback) still run.
        return self.log_probs + empty_logits.sum(), self.entropy


@contextmanager
def capture_head_log_probs(
    head: LMHead, labels: torch.Tensor, temperature: float, with_entropy: bool
) -> Iterator[HeadCapture]:
    """Inside the block, a forward of the model that owns ``head`` computes the ``labels``'
    log-probs from the head's input (hidden states shaped like ``labels`` + (H,)) and gives the
    head an empty input instead. Other threads' calls of the model are left alone."""
    capture = HeadCapture()

    def hook(_module: torch.nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...] | None:
        if threading.get_ident() != capture.thread:
            return None
        hidden = args[0]
        capture.log_probs, capture.entropy = head_log_probs(hidden, head, labels, temperature, with_entropy)
        return (hidden[..., :0, :], *args[1:])

    handle = head.linear.register_forward_pre_hook(hook)
    try:
        yield capture
    finally:
        handle.remove()
