"""Choosing the next token from logits: greedy, temperature, top-k, top-p (nucleus).

Order of the warpers is Hugging Face's: divide by the temperature, keep the top-k logits,
then keep the smallest set of most likely tokens whose probability mass (after the top-k
renormalisation) reaches top-p; sample from the renormalised rest.

The log-prob returned for a sampled token is ``log softmax(z / T)[token]`` over the *whole*
vocabulary (not truncated by top-k / top-p), which is what the actor recomputes when it
divides its logits by the same temperature. Greedy decoding scores its tokens the way the
actor does: at the configured temperature when it is > 0 (``do_sample=False``), at 1 when it
is 0.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from hybridflow.algorithms.utils import logprobs_from_logits
from hybridflow.utils.errors import InputError

# Nucleus sampling first looks among this many most likely tokens; only rows where they do
# not hold the requested mass fall back to sorting the whole vocabulary.
_TOP_P_CANDIDATES = 1024
_BLOCK = 512  # entries per block of the two-level inverse-CDF draw


@dataclass(frozen=True)
class GenerationParams:
    """How one ``generate`` call picks tokens.

    ``top_k <= 0`` and ``top_p == 1`` mean "off"; ``do_sample=False`` or ``temperature == 0``
    means greedy. ``stop_token_ids`` end a response (the stop token is kept in it) unless
    ``ignore_eos``; ``n`` responses are drawn for every prompt row. ``suppress_token_ids`` are
    never chosen (their logits count as -inf; a vision-language model's image pads and vision
    markers); the log-prob of a chosen token is still over the whole vocabulary, as the actor
    computes it.
    """

    max_new_tokens: int
    temperature: float = 1.0
    top_k: int = -1
    top_p: float = 1.0
    do_sample: bool = True
    n: int = 1
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    suppress_token_ids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.n < 1:
            raise ValueError(f"n must be >= 1, got {self.n}")

    @property
    def greedy(self) -> bool:
        return not self.do_sample or self.temperature == 0


class NonFiniteLogitsError(InputError, RuntimeError):
    """The model produced NaN or +inf logits (or no finite logit at all) for some rows: its
    weights or activations are broken, and no token can be chosen from them."""


def nonfinite_rows(logits: torch.Tensor) -> torch.Tensor:
    """(b, V) → (b,) bool: rows with a NaN or +inf logit, or without any finite logit.

    One reduction: the row maximum is NaN when any entry is NaN (``amax`` propagates it),
    +inf when any entry is +inf, and -inf only when every entry is. ``-inf`` entries beside
    finite ones are a legitimate mask and pass.
    """
    return ~torch.isfinite(logits.amax(dim=-1))


def check_finite_logits(logits: torch.Tensor) -> None:
    """Raise :class:`NonFiniteLogitsError` when any row of ``logits`` (b, V) is unusable.

    Without this a NaN row turns into NaN probabilities, and the inverse-CDF draw returns an
    index past the vocabulary (an ``IndexError`` far from the cause) or argmax a meaningless id.
    """
    _raise_if_nonfinite(logits.amax(dim=-1))


def nonfinite_message(bad_rows: int, rows: int, consequence: str) -> str:
    """The one message for a model whose logits are NaN / inf, wherever it is found (sampling,
    SFT or reward-model training); ``consequence`` says what cannot be done with it."""
    return (
        f"the model produced non-finite logits (NaN or inf) for {bad_rows} of {rows} rows; "
        f"the model is broken (check its weights), {consequence}"
    )


def token_log_probs(logits: torch.Tensor, tokens: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """``log softmax(logits / temperature)[tokens]``: (..., V), (...) → (...) float32.

    The actor's own formula (:func:`hybridflow.algorithms.utils.logprobs_from_logits`), so
    rollout and actor log-probs differ only by the logits' numerics.
    """
    return logprobs_from_logits(logits.float(), tokens, temperature)


def _nucleus_candidates(scaled: torch.Tensor, top_k: int, top_p: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Sorted (descending) candidate logits and their token ids, top-k / top-p applied.

    Removed candidates get ``-inf``. Top-p keeps token i when the mass of the tokens ranked
    before it is below ``top_p`` (so the first token is always kept).
    """
    vocab = scaled.shape[-1]
    if top_k > 0:
        values, ids = scaled.topk(min(top_k, vocab), dim=-1)
        # Top-p then acts on the distribution renormalised over the top-k tokens.
        probs = torch.softmax(values, dim=-1)
    else:
        values, ids = scaled.topk(min(_TOP_P_CANDIDATES, vocab), dim=-1)
        probs = torch.exp(values - torch.logsumexp(scaled, dim=-1, keepdim=True))
        if values.shape[-1] < vocab and bool((probs.sum(-1) < top_p).any()):
            values, ids = scaled.sort(dim=-1, descending=True)
            probs = torch.softmax(values, dim=-1)
    if top_p < 1.0:
        mass_before = probs.cumsum(-1) - probs
        values = values.masked_fill(mass_before >= top_p, float("-inf"))
    return values, ids


def _draw(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """One index per row with probability ∝ ``probs`` (b, K) → (b,), by inverting the CDF.

    ``torch.multinomial`` on CPU draws an exponential variate for every entry (~50 ms per step
    for 32 × 49k). Here: one uniform per row; the CDF over blocks of ``_BLOCK`` entries picks a
    block, the CDF inside that block picks the entry — two short cumulative sums instead of
    one over the whole vocabulary.
    """
    rows, size = probs.shape
    u = torch.rand((rows, 1), generator=generator, device=probs.device, dtype=probs.dtype)
    if size <= 2 * _BLOCK:
        return _invert(probs.cumsum(dim=-1), u)
    # A vocabulary that is a multiple of the block (49,152 = 96 · 512) needs no padded copy.
    padded = probs if size % _BLOCK == 0 else torch.nn.functional.pad(probs, (0, (-size) % _BLOCK))
    padded = padded.reshape(rows, -1, _BLOCK)
    block_mass = padded.sum(dim=-1)
    block_cdf = block_mass.cumsum(dim=-1)
    block = _invert(block_cdf, u)
    # Position of u inside the chosen block, rescaled to that block's own mass.
    before = block_cdf.gather(1, block[:, None]) - block_mass.gather(1, block[:, None])
    inner = padded[torch.arange(rows, device=probs.device), block]
    target = (u * block_cdf[:, -1:] - before).clamp_(min=0)
    offset = _invert(inner.cumsum(dim=-1), target / inner.sum(dim=-1, keepdim=True).clamp_(min=1e-30))
    return block * _BLOCK + offset


def _invert(cdf: torch.Tensor, frac: torch.Tensor) -> torch.Tensor:
    """First index whose CDF exceeds ``frac`` × total, for ``frac`` (b, 1) in [0, 1].

    The target is kept strictly below the total, so some entry always exceeds it, and an
    entry of zero mass (CDF equal to its predecessor's) is never the first to exceed it.
    """
    total = cdf[:, -1:]
    target = torch.minimum(frac * total, torch.nextafter(total, torch.zeros_like(total)))
    return torch.searchsorted(cdf, target, right=True)[:, 0]


def sample_next(
    logits: torch.Tensor, params: GenerationParams, generator: torch.Generator | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pick one token per row. logits (b, V) float32 → tokens (b,) int64, log-probs (b,) float32.

    Raises :class:`NonFiniteLogitsError` when a row's logits are NaN / +inf (a broken model).
    """
    allowed = _suppressed(logits, params.suppress_token_ids)
    if params.greedy:
        return _greedy(logits, allowed, params.temperature if params.temperature > 0 else 1.0)
    top = logits.amax(dim=-1)
    _raise_if_nonfinite(top)
    # Same division as the actor's (logits / τ), so the log-probs below match it bit for bit.
    scaled = logits / params.temperature if params.temperature != 1.0 else logits
    if allowed is logits:
        choose = scaled
    else:  # suppressed tokens are never drawn, but the log-prob stays over the whole vocabulary
        choose = allowed / params.temperature if params.temperature != 1.0 else allowed
    if params.top_k > 0 or params.top_p < 1.0:
        values, ids = _nucleus_candidates(choose, params.top_k, params.top_p)
        tokens = ids.gather(-1, _draw(torch.softmax(values, dim=-1), generator)[:, None])[:, 0]
    else:
        tokens = _draw(torch.softmax(choose, dim=-1), generator)
    if params.temperature == 1.0:  # the finite check's row maxima are logsumexp's too
        return tokens, _log_probs_given_max(logits, tokens, top)
    return tokens, token_log_probs(scaled, tokens)


def _raise_if_nonfinite(row_max: torch.Tensor) -> None:
    """:func:`check_finite_logits` given the row maxima (b,) already at hand (saves a pass)."""
    bad = ~torch.isfinite(row_max)
    if bool(bad.any()):
        raise NonFiniteLogitsError(nonfinite_message(int(bad.sum()), bad.numel(), "no token can be sampled"))


def _greedy(logits: torch.Tensor, allowed: torch.Tensor, temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The most likely allowed token per row and its log-prob at ``temperature``.

    One ``max`` pass gives the token (the first maximal index, as ``argmax``), the finite check
    and, at temperature 1, logsumexp's row maxima: three passes over the (b, V) logits fewer.
    """
    top, tokens = allowed.max(dim=-1)
    if allowed is not logits:
        top = logits.amax(dim=-1)
    _raise_if_nonfinite(top)
    if temperature == 1.0:
        return tokens, _log_probs_given_max(logits, tokens, top)
    return tokens, token_log_probs(logits, tokens, temperature)


def _log_probs_given_max(logits: torch.Tensor, tokens: torch.Tensor, row_max: torch.Tensor) -> torch.Tensor:
    """``logits[token] − logsumexp(logits)`` for float32 logits (b, V) with finite row maxima.

    The steps of ``torch.logsumexp`` (sum of exp(z − max), log, + max) on the maxima already
    computed, so the result is :func:`token_log_probs`' bit for bit (tested), one pass cheaper.
    """
    if logits.dtype != torch.float32:
        return token_log_probs(logits, tokens)
    total = (logits - row_max[:, None]).exp_().sum(dim=-1)
    lse = total.log_().add_(row_max)
    return logits.gather(-1, tokens[:, None])[:, 0] - lse


def _suppressed(logits: torch.Tensor, token_ids: tuple[int, ...]) -> torch.Tensor:
    """``logits`` with ``token_ids``' entries at -inf (``logits`` itself when there are none)."""
    if not token_ids:
        return logits
    index = torch.tensor([i for i in token_ids if i < logits.shape[-1]], dtype=torch.long, device=logits.device)
    return logits.index_fill(-1, index, float("-inf"))
