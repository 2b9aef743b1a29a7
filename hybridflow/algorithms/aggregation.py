"""Loss aggregation: turn a (B, T) per-token loss matrix into the scalar that is back-propagated.

Modes (``actor.loss_agg_mode`` / ``critic.loss_agg_mode``), with L the loss matrix, m the mask,
N = Σ m the number of valid tokens and S = #{i : Σ_t m_it > 0} the number of non-empty sequences:

* ``token-mean``               Σ L·m / N
* ``token-sum``                Σ L·m                        (ours; not in verl b178a3c)
* ``seq-mean-token-sum``       Σ_i (Σ_t L·m) / S
* ``seq-mean-token-mean``      Σ_i (Σ_t L·m / (Σ_t m + 1e-8)) / S
* ``seq-mean-token-sum-norm``  Σ_i (Σ_t L·m) / S / C   (Dr.GRPO, arXiv 2503.20783; C =
                               ``loss_scale_factor``, default T = the padded length)

How to combine micro-batches and data-parallel ranks (the contract the actor/critic follow)
----------------------------------------------------------------------------------------------
Let one optimizer step consume a *mini-batch* that is split over ``dp_size`` ranks and, on each
rank, into micro-batches. Before the first micro-batch, compute over the WHOLE mini-batch
(all ranks together, e.g. with an all-reduce of the local counts):

* ``batch_num_tokens``  = Σ m over the mini-batch         (token-mean)
* ``global_batch_size`` = S over the mini-batch           (all seq-mean-* modes)
* ``loss_scale_factor`` = one constant C for the whole run (seq-mean-token-sum-norm; pass it
  explicitly — the default T changes when micro-batches are padded to different lengths)

Then for every micro-batch call ``agg_loss(L_mb, m_mb, mode, dp_size=dp_size,
batch_num_tokens=..., global_batch_size=..., loss_scale_factor=...)`` and call ``backward()`` on
that value **as is** — do not divide by the number of micro-batches: the gradients of the
micro-batches simply add up. The data-parallel gradient all-reduce *averages* over ranks (DDP /
FSDP do), which cancels the ``× dp_size`` inside. Result: the accumulated gradient equals the
gradient of the full mini-batch loss, and the loss to log is the sum of the micro-batch values
(averaged over ranks). With ``dp_size=1`` and no counts given, the counts are taken from the
tensors passed in, i.e. the call aggregates exactly what it is given.

``token-sum`` needs no counts (each rank's sum × dp_size, then averaged by the all-reduce).

Non-finite check: the aggregated scalar is tested with ``torch.isfinite`` and a ValueError is
raised if it is NaN/inf. This is one device→host sync per call; a finite sum implies every
masked entry was finite, so it is the cheapest check that still refuses to train on NaN.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from hybridflow.algorithms.utils import MASK_EPS, masked_sum

LOSS_AGG_MODES: tuple[str, ...] = (
    "token-mean",
    "token-sum",
    "seq-mean-token-sum",
    "seq-mean-token-mean",
    "seq-mean-token-sum-norm",
)

Count = int | float | torch.Tensor


@dataclass(frozen=True)
class GlobalBatchInfo:
    """The normalisers of :func:`agg_loss` for one mini-batch (see the module docstring).

    Policy losses and the value loss take one of these (``global_batch_info=``) and forward it to
    :func:`agg_loss`; ``None`` means "aggregate the tensors passed in as the whole batch".
    """

    dp_size: int = 1
    batch_num_tokens: Count | None = None
    global_batch_size: Count | None = None
    loss_scale_factor: float | None = None

    def __post_init__(self) -> None:
        if self.dp_size < 1:
            raise ValueError(f"GlobalBatchInfo.dp_size must be >= 1, got {self.dp_size}")
        if self.loss_scale_factor is not None and self.loss_scale_factor <= 0:
            raise ValueError(f"GlobalBatchInfo.loss_scale_factor must be > 0, got {self.loss_scale_factor}")


def _at_least_one(count: Count) -> Count:
    # An empty batch (no valid token / sequence) gives loss 0 instead of 0/0 = NaN.
    if isinstance(count, torch.Tensor):
        return count.clamp(min=1)
    return max(count, 1)


def _require_global(count: Count | None, name: str, mode: str, dp_size: int) -> None:
    if count is None and dp_size > 1:
        raise ValueError(f"agg_loss({mode!r}) with dp_size={dp_size} needs the global {name}")


def agg_loss(
    loss_mat: torch.Tensor,
    loss_mask: torch.Tensor,
    loss_agg_mode: str,
    *,
    dp_size: int = 1,
    batch_num_tokens: Count | None = None,
    global_batch_size: Count | None = None,
    loss_scale_factor: float | None = None,
) -> torch.Tensor:
    """Aggregate a (B, T) loss matrix over a (B, T) mask into a scalar (formulas: module docstring).

    ``dp_size``, ``batch_num_tokens``, ``global_batch_size`` and ``loss_scale_factor`` are the
    global normalisers described in the module docstring; every mode multiplies by ``dp_size``.
    Raises ValueError on an unknown mode, on mismatched shapes, and when the result is NaN/inf.
    """
    if loss_mat.shape != loss_mask.shape:
        raise ValueError(f"loss_mat {tuple(loss_mat.shape)} and loss_mask {tuple(loss_mask.shape)} differ")
    if loss_agg_mode == "token-mean":
        _require_global(batch_num_tokens, "batch_num_tokens", loss_agg_mode, dp_size)
        tokens = loss_mask.sum() if batch_num_tokens is None else batch_num_tokens
        loss = masked_sum(loss_mat, loss_mask) / _at_least_one(tokens) * dp_size
    elif loss_agg_mode == "token-sum":
        loss = masked_sum(loss_mat, loss_mask) * dp_size
    elif loss_agg_mode in ("seq-mean-token-sum", "seq-mean-token-sum-norm", "seq-mean-token-mean"):
        loss = _seq_mean(loss_mat, loss_mask, loss_agg_mode, dp_size, global_batch_size, loss_scale_factor)
    else:
        raise ValueError(f"unknown loss_agg_mode {loss_agg_mode!r}; valid modes: {', '.join(LOSS_AGG_MODES)}")
    if not bool(torch.isfinite(loss)):
        raise ValueError(
            f"agg_loss({loss_agg_mode!r}) produced {loss.item()}: the loss matrix holds NaN/inf at a "
            "valid (mask = 1) position"
        )
    return loss


def _seq_mean(
    loss_mat: torch.Tensor,
    loss_mask: torch.Tensor,
    mode: str,
    dp_size: int,
    global_batch_size: Count | None,
    loss_scale_factor: float | None,
) -> torch.Tensor:
    _require_global(global_batch_size, "global_batch_size", mode, dp_size)
    tokens_per_seq = loss_mask.sum(dim=-1)
    seq_losses = masked_sum(loss_mat, loss_mask, axis=-1)
    if mode == "seq-mean-token-mean":
        seq_losses = seq_losses / (tokens_per_seq + MASK_EPS)
    seq_valid = (tokens_per_seq > 0).to(seq_losses.dtype)
    sequences = seq_valid.sum() if global_batch_size is None else global_batch_size
    loss = masked_sum(seq_losses, seq_valid) / _at_least_one(sequences) * dp_size
    if mode == "seq-mean-token-sum-norm":
        loss = loss / (loss_mask.shape[-1] if loss_scale_factor is None else loss_scale_factor)
    return loss


def agg_loss_with_info(
    loss_mat: torch.Tensor,
    loss_mask: torch.Tensor,
    loss_agg_mode: str,
    global_batch_info: GlobalBatchInfo | None,
) -> torch.Tensor:
    """:func:`agg_loss` with the normalisers taken from a :class:`GlobalBatchInfo` (None = local)."""
    info = global_batch_info if global_batch_info is not None else GlobalBatchInfo()
    return agg_loss(
        loss_mat,
        loss_mask,
        loss_agg_mode,
        dp_size=info.dp_size,
        batch_num_tokens=info.batch_num_tokens,
        global_batch_size=info.global_batch_size,
        loss_scale_factor=info.loss_scale_factor,
    )


def global_batch_info_for(
    response_mask: torch.Tensor, dp_size: int = 1, loss_scale_factor: float | None = None
) -> GlobalBatchInfo:
    """Counts of one whole mini-batch (already gathered from all ranks) as a GlobalBatchInfo.

    ``batch_num_tokens`` = Σ m, ``global_batch_size`` = number of rows with at least one valid
    token. A rank that only sees its own shard must all-reduce (sum) these two counts instead.
    """
    return GlobalBatchInfo(
        dp_size=dp_size,
        batch_num_tokens=response_mask.sum(),
        global_batch_size=(response_mask.sum(dim=-1) > 0).sum(),
        loss_scale_factor=loss_scale_factor,
    )
