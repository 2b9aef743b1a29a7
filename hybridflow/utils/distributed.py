"""Small torch.distributed helpers shared by the FSDP engine and the data-parallel workers.

Every function here is a collective when the default process group spans several ranks:
all ranks must call it, in the same order. Without an initialised group (one process) each
one returns its input unchanged, so single-process code paths need no special case.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist


def is_distributed() -> bool:
    """True when a default process group with more than one rank is initialised."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def collective_device() -> torch.device:
    """Where tensors must live for a collective: the current GPU under NCCL, else the CPU (gloo)."""
    if dist.is_initialized() and dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def all_reduce_sum(tensor: torch.Tensor) -> torch.Tensor:
    """Σ over ranks of ``tensor`` (any shape), computed in float64 and returned on the
    input's device in the input's dtype, so integer-valued counts stay exact."""
    if not is_distributed():
        return tensor
    buf = tensor.detach().to(device=collective_device(), dtype=torch.float64)
    dist.all_reduce(buf, op=dist.ReduceOp.SUM)
    return buf.to(device=tensor.device, dtype=tensor.dtype)


def all_reduce_max_int(value: int) -> int:
    """The largest ``value`` over ranks."""
    if not is_distributed():
        return int(value)
    buf = torch.tensor([int(value)], dtype=torch.int64, device=collective_device())
    dist.all_reduce(buf, op=dist.ReduceOp.MAX)
    return int(buf.item())


def broadcast_object(obj: Any, src: int = 0) -> Any:
    """Rank ``src``'s ``obj`` (picklable) on every rank."""
    if not is_distributed():
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=src)
    return box[0]


def barrier() -> None:
    """Wait until every rank reaches this point."""
    if is_distributed():
        dist.barrier()
