"""What a data-parallel rank needs to train like one process: mini-batch-wide loss normalisers.

Each rank sees only its chunk of a mini-batch, but ``token-mean`` divides by the token count
of the *whole* mini-batch and the ``seq-mean-*`` modes by its number of non-empty sequences
(see :mod:`hybridflow.algorithms.aggregation`). :func:`dp_global_batch_info` sums the local
counts over ranks (an all-reduce: every rank calls it once per mini-batch, in the same
order); with the ``× dp_size`` inside ``agg_loss`` and the gradient *average* of FSDP the
update equals the one-process update on the whole mini-batch.

It also holds the dispatch modes of the data-parallel worker methods whose results are not
(only) a ``DataProto`` (see docs/workers.md, "Results: data and metrics"):

* :data:`DP_METRICS` — ``update_actor`` / ``update_critic``: each rank trains on its chunk and
  returns its metrics dict; the controller gets ``{name: [rank 0's value, rank 1's, ...]}``.
* :data:`DP_COMPUTE_PROTO_WITH_OPTIONS` — ``compute_log_prob(data, calculate_sum_pi_squared=...)``:
  the ``DataProto`` arguments are chunked per rank, every other argument (an option) goes to
  every rank unchanged; outputs are concatenated as ``DP_COMPUTE_PROTO`` does.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from hybridflow.algorithms.aggregation import GlobalBatchInfo, global_batch_info_for
from hybridflow.controller.dispatch import (
    DispatchContext,
    Dispatched,
    DispatchMode,
    collect_dp_compute_data_proto,
    dispatch_dp_compute_data_proto,
)
from hybridflow.protocol import DataProto, DataProtoFuture
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
    tokens, rows = local.batch_num_tokens, local.global_batch_size
    assert isinstance(tokens, torch.Tensor) and isinstance(
        rows, torch.Tensor
    )  # global_batch_info_for counts in tensors
    counts = all_reduce_sum(torch.stack([tokens, rows.to(tokens.dtype)]))
    return GlobalBatchInfo(
        dp_size=dp_size,
        batch_num_tokens=counts[0],
        global_batch_size=counts[1],
        loss_scale_factor=loss_scale_factor,
    )


# --- results back to the controller -------------------------------------------------------------


def merge_rank_metrics(per_rank: Sequence[Mapping[str, Any]]) -> dict[str, list[Any]]:
    """Each rank's metrics dict → ``{name: [values in rank order]}`` (``reduce_metrics`` averages)."""
    merged: dict[str, list[Any]] = {}
    for rank, metrics in enumerate(per_rank):
        if not isinstance(metrics, Mapping):
            raise TypeError(
                f"a metrics-returning worker method must return a dict, but rank {rank} "
                f"returned a {type(metrics).__name__}"
            )
        for name, value in metrics.items():
            merged.setdefault(name, []).append(value)
    return merged


def collect_rank_metrics(ctx: DispatchContext, outputs: list[Any]) -> dict[str, list[Any]]:
    """Collect function of :data:`DP_METRICS`."""
    return merge_rank_metrics(outputs)


def _is_data(value: Any) -> bool:
    return isinstance(value, DataProto | DataProtoFuture)


def dispatch_proto_with_options(ctx: DispatchContext, *args: Any, **kwargs: Any) -> Dispatched:
    """``DataProto`` / ``DataProtoFuture`` arguments chunked per rank (auto-padding as in
    ``DP_COMPUTE_PROTO``); every other argument replicated to each rank."""
    data_args = [a for a in args if _is_data(a)]
    data_kwargs = {k: v for k, v in kwargs.items() if _is_data(v)}
    if not data_args and not data_kwargs:
        raise TypeError("a DP_COMPUTE_PROTO_WITH_OPTIONS call needs at least one DataProto argument to split")
    split = dispatch_dp_compute_data_proto(ctx, *data_args, **data_kwargs)
    chunks = iter(split.args)
    n = ctx.world_size
    per_arg = tuple(next(chunks) if _is_data(a) else [a] * n for a in args)
    per_kwarg = {k: split.kwargs[k] if k in data_kwargs else [v] * n for k, v in kwargs.items()}
    return Dispatched(per_arg, per_kwarg, split.pad_size)


DP_METRICS = DispatchMode(dispatch_fn=dispatch_dp_compute_data_proto, collect_fn=collect_rank_metrics)
DP_COMPUTE_PROTO_WITH_OPTIONS = DispatchMode(
    dispatch_fn=dispatch_proto_with_options, collect_fn=collect_dp_compute_data_proto
)
