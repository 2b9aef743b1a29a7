"""What a data-parallel rank needs to train like one process: mini-batch-wide loss normalisers.

Each rank sees only its chunk of a mini-batch, but ``token-mean`` divides by the token count
of the *whole* mini-batch and the ``seq-mean-*`` modes by its number of non-empty sequences
(see :mod:`hybridflow.algorithms.aggregation`). :func:`dp_global_batch_info` sums the local
counts over ranks (an all-reduce: every rank calls it once per mini-batch, in the same
order); with the ``× dp_size`` inside ``agg_loss`` and the gradient *average* of FSDP the
update equals the one-process update on the whole mini-batch.
"""

from __future__ import annotations

import torch

from hybridflow.algorithms.aggregation import GlobalBatchInfo, global_batch_info_for
from hybridflow.utils.distributed import all_reduce_sum, is_distributed


def dp_global_batch_info(
    response_mask: torch.Tensor, dp_size: int, loss_scale_factor: float | None = None
) -> GlobalBatchInfo:
    """Normalisers of the mini-batch whose local chunk has ``response_mask`` (b, T).

    ``dp_size`` = 1: the local counts. ``dp_size`` > 1: the counts summed over the ranks of
    the default process group, which must have exactly ``dp_size`` ranks.
    """
    local = global_batch_info_for(response_mask, dp_size=dp_size, loss_scale_factor=loss_scale_factor)
    if dp_size == 1:
        return local
    if not is_distributed() or torch.distributed.get_world_size() != dp_size:
        group = torch.distributed.get_world_size() if is_distributed() else 1
        raise RuntimeError(
            f"data-parallel size {dp_size} needs a torch.distributed group of {dp_size} ranks, found {group}; "
            "call Worker.init_process_group() on every rank first"
        )
    tokens = local.batch_num_tokens
    counts = all_reduce_sum(torch.stack([tokens, local.global_batch_size.to(tokens.dtype)]))
    return GlobalBatchInfo(
        dp_size=dp_size,
        batch_num_tokens=counts[0],
        global_batch_size=counts[1],
        loss_scale_factor=loss_scale_factor,
    )
