"""The SFT objective: mean negative log-likelihood of the target (assistant) tokens.

Rows are right-padded token sequences (``SFTDataset``). Token t is predicted at position
t − 1, so the forward pass returns ``log_probs[:, t] = log π(x_t | x_<t)`` aligned with the
tokens (column 0 is always 0: nothing predicts the first token), and the loss of a
mini-batch with N = Σ loss_mask target tokens is

    L = −(1/N) Σ_{i,t} loss_mask[i, t] · log_probs[i, t]        (token-mean)

Each micro-batch contributes its share with the mini-batch's N (``agg_loss`` with
``batch_num_tokens``), so the accumulated gradient — and the logged loss, the sum of the
shares — does not depend on how the mini-batch is split.

Packed rows (``model.use_remove_padding``: the model was loaded with a packed attention
implementation, :mod:`hybridflow.models.packed_attention`): every micro-batch runs as one row
holding each conversation's real tokens back to back, positions restarting at 0 per
conversation, attention inside each conversation only (the actor's packer,
:func:`hybridflow.engine.forward.pack_micro_batch`, with every token after the first a
"response" token). The log-probs come back in the padded (b, L) layout, so the loss mask and
N are untouched by packing; the values equal the padded path's up to float rounding.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from tensordict import TensorDict

from hybridflow import fields as FK
from hybridflow.algorithms.aggregation import agg_loss
from hybridflow.algorithms.utils import logprobs_from_logits
from hybridflow.data.sft_dataset import LOSS_MASK
from hybridflow.engine.forward import Packed, pack_micro_batch, packs_rows, unpack
from hybridflow.engine.multimodal_inputs import (
    check_image_tokens,
    image_model_kwargs,
    is_multimodal,
    model_position_ids,
)
from hybridflow.inference.sampling import (
    NonFiniteLogitsError,
    nonfinite_message,
    nonfinite_rows,
)

LOG_PROBS = "log_probs"
NOT_TRAINABLE = "it cannot be trained"


def token_log_probs(module: torch.nn.Module, micro: TensorDict) -> dict[str, torch.Tensor]:
    """``{"log_probs": (b, L)}``: log π(x_t | x_<t) at every real token t ≥ 1, 0 elsewhere.

    Packed (one row, no padding) when ``module`` packs rows, else padded: the micro-batch is
    cut to its longest row first (right padding beyond it costs compute and changes nothing:
    real tokens never attend to later positions). Computed in float32.
    Raises :class:`NonFiniteLogitsError` (the sampler's message) when a real position's logits
    are NaN / inf: a broken model, not a loss to train on.
    """
    if packs_rows(module) and not is_multimodal(micro):
        return packed_token_log_probs(module, micro)
    return padded_token_log_probs(module, micro)


def padded_token_log_probs(module: torch.nn.Module, micro: TensorDict) -> dict[str, torch.Tensor]:
    """:func:`token_log_probs` over the (b, L) right-padded rows as they are; rows with images
    (``multi_modal_inputs``, (b, 3, L) positions) pass their pixel values to the model."""
    attention_mask = micro[FK.ATTENTION_MASK]
    width = attention_mask.shape[1]
    used = attention_mask.bool().any(dim=0).nonzero().flatten()
    hi = max(int(used[-1]) + 1, 2) if used.numel() else 2
    input_ids = micro[FK.INPUT_IDS][:, :hi]
    images = image_model_kwargs(micro, input_ids.device)  # {} for text rows
    check_image_tokens(module, input_ids, images)
    out = module(
        input_ids=input_ids,
        attention_mask=attention_mask[:, :hi],
        position_ids=model_position_ids(micro[FK.POSITION_IDS][..., :hi]),
        use_cache=False,
        **images,
    )
    log_probs = logprobs_from_logits(out.logits[:, :-1, :].float(), input_ids[:, 1:])
    check_finite_positions(out.logits[:, :-1, :], log_probs, attention_mask[:, : hi - 1].bool())
    log_probs = F.pad(log_probs, (1, width - hi))
    return {LOG_PROBS: log_probs * attention_mask.to(log_probs.dtype)}


def packed_token_log_probs(module: torch.nn.Module, micro: TensorDict) -> dict[str, torch.Tensor]:
    """:func:`token_log_probs` with the micro-batch's conversations packed into one row.

    Token t ≥ 1 of a row is the packer's response column t − 1 and token 0 its one-token
    "prompt", so the packer keeps exactly the positions that predict a real token; a row of
    one token predicts nothing and is left out. Rows must be right-padded (SFT's layout)."""
    ids, mask = micro[FK.INPUT_IDS], micro[FK.ATTENTION_MASK]
    width = ids.shape[1]
    if bool((mask[:, 1:] > mask[:, :-1]).any()):
        raise ValueError("packed SFT rows must be right-padded: a real token follows a padding position")
    if width < 2 or not bool(mask[:, 1:].any()):
        # nothing to predict: the padded pass still runs the model (every FSDP rank must, and
        # the loss keeps a graph), and returns zeros
        return padded_token_log_probs(module, micro)
    packed = pack_micro_batch(micro, width - 1)
    logits = module(**packed.inputs, use_cache=False, logits_to_keep=packed.keep).logits[0]  # (K, V)
    kept = logprobs_from_logits(logits.float(), ids[:, 1:][packed.rows, packed.cols])  # (K,)
    _check_finite_packed(logits, kept, packed)
    return {LOG_PROBS: F.pad(unpack(kept, packed), (1, 0))}


def _check_finite_packed(logits: torch.Tensor, log_probs: torch.Tensor, packed: Packed) -> None:
    """:func:`check_finite_positions` for the packed row: ``logits`` (K, V) at the kept positions;
    the message counts conversations (rows of the micro-batch), as the padded path's does."""
    if bool(torch.isfinite(log_probs).all()):
        return
    bad = unpack(nonfinite_rows(logits), packed).any(dim=-1)  # (b,)
    if bool(bad.any()):
        raise NonFiniteLogitsError(nonfinite_message(int(bad.sum()), bad.numel(), NOT_TRAINABLE))


def check_finite_positions(logits: torch.Tensor, log_probs: torch.Tensor, real: torch.Tensor) -> None:
    """Raise :class:`NonFiniteLogitsError` when the logits (b, L, V) at a real position (``real``,
    (b, L)) hold NaN / inf. The log-probs (b, L) are checked first: they are finite whenever the
    logits are, so the pass over the vocabulary runs only for a batch that is already in trouble."""
    if bool((torch.isfinite(log_probs) | ~real).all()):
        return
    bad = (nonfinite_rows(logits) & real).any(dim=-1)
    if bool(bad.any()):
        raise NonFiniteLogitsError(nonfinite_message(int(bad.sum()), bad.numel(), NOT_TRAINABLE))


def sft_loss(
    outputs: dict[str, torch.Tensor], micro: TensorDict, *, batch_num_tokens: int, dp_size: int = 1
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """This micro-batch's share of the mini-batch token-mean NLL; ``batch_num_tokens`` = N above,
    counted over all ``dp_size`` data-parallel ranks. The share is × ``dp_size``: the ranks'
    gradients are averaged (FSDP), which takes that factor out again."""
    log_probs = outputs[LOG_PROBS]
    mask = micro[LOSS_MASK].to(log_probs.dtype)
    loss = agg_loss(-log_probs, mask, "token-mean", dp_size=dp_size, batch_num_tokens=batch_num_tokens)
    return loss, {"loss": loss.detach()}


def masked_nll_sum(log_probs: torch.Tensor, loss_mask: torch.Tensor) -> tuple[float, int]:
    """``(Σ −log_probs · mask, Σ mask)`` in float64, to average a loss over many batches exactly."""
    mask = loss_mask.to(torch.float64)
    return float(-(log_probs.detach().to(torch.float64) * mask).sum()), int(loss_mask.sum())
