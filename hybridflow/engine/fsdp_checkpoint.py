"""Sharded checkpoints of the FSDP engine, written with ``torch.distributed.checkpoint`` (DCP).

Layout of one engine checkpoint folder, written by all ranks together::

    fsdp_meta.json                          {"format": "hybridflow-fsdp", "version": 1, "world_size": W}
    model/__{r}_0.distcp, model/.metadata   the module's state dict: one file per rank r (its
                                            rows of each weight) + the global shapes / offsets
    optim/__{r}_0.distcp, optim/.metadata   the optimizer state, keyed by parameter name
    extra_state_world_size_{W}_rank_{r}.pt  lr scheduler + RNG states of rank r

DCP records which rows of which tensor each file holds, so a checkpoint loads into any number
of ranks (resharding), and :func:`read_full_model_state` rebuilds the full tensors without a
process group — what the model merger needs. Like the torch engine's checkpoints, the folder
is written under a temporary name (chosen by rank 0) and renamed into place by rank 0 once
every rank's files are on disk. All ranks must see the same file system (one machine, or a
shared mount across nodes).
"""

from __future__ import annotations

import json
import os
import warnings
from contextlib import ExitStack
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.metadata import TensorStorageMetadata
from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from hybridflow.engine.checkpoint import atomic_directory, capture_rng_state, restore_rng_state
from hybridflow.utils.distributed import barrier, broadcast_object

FSDP_META_FILE = "fsdp_meta.json"
FSDP_FORMAT = "hybridflow-fsdp"
FSDP_FORMAT_VERSION = 1
MODEL_DIR = "model"
OPTIM_DIR = "optim"


def extra_state_file(rank: int, world_size: int) -> str:
    """Name of rank ``rank``'s scheduler/RNG file (verl's naming)."""
    return f"extra_state_world_size_{world_size}_rank_{rank}.pt"


def is_fsdp_checkpoint(path: str | os.PathLike) -> bool:
    """True when ``path`` holds a checkpoint written by :func:`save_sharded_state`."""
    return (Path(path) / FSDP_META_FILE).is_file()


def read_fsdp_meta(path: str | os.PathLike) -> dict[str, object]:
    """The metadata of an FSDP checkpoint folder; a clear error if it is not one."""
    file = Path(path) / FSDP_META_FILE
    if not file.is_file():
        raise FileNotFoundError(f"{path} is not an FSDP engine checkpoint: {FSDP_META_FILE} is missing")
    meta = json.loads(file.read_text())
    if meta.get("format") != FSDP_FORMAT or meta.get("version") != FSDP_FORMAT_VERSION:
        raise ValueError(
            f"{file} describes format {meta.get('format')!r} version {meta.get('version')!r}; "
            f"expected {FSDP_FORMAT!r} version {FSDP_FORMAT_VERSION}"
        )
    return meta


def save_sharded_state(
    path: str | os.PathLike,
    module: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    lr_scheduler: torch.optim.lr_scheduler.LRScheduler,
) -> Path:
    """Write the checkpoint folder ``path`` (collective: every rank calls it with the same path)."""
    rank, world_size = dist.get_rank(), dist.get_world_size()
    model_state = get_model_state_dict(module)
    optim_state = get_optimizer_state_dict(module, optimizer)
    with ExitStack() as stack:
        staging = stack.enter_context(atomic_directory(path)) if rank == 0 else None
        staging = Path(broadcast_object(str(staging)))
        dcp.save(model_state, checkpoint_id=staging / MODEL_DIR)
        dcp.save(optim_state, checkpoint_id=staging / OPTIM_DIR)
        extra = {"lr_scheduler": lr_scheduler.state_dict(), "rng": capture_rng_state()}
        torch.save(extra, staging / extra_state_file(rank, world_size))
        if rank == 0:
            meta = {"format": FSDP_FORMAT, "version": FSDP_FORMAT_VERSION, "world_size": world_size}
            (staging / FSDP_META_FILE).write_text(json.dumps(meta, indent=2) + "\n")
        barrier()  # every rank's files are written before rank 0 renames the folder
    barrier()  # the rename is done before any rank goes on (e.g. to read the checkpoint)
    return Path(path)


def load_sharded_state(
    path: str | os.PathLike,
    module: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    lr_scheduler: torch.optim.lr_scheduler.LRScheduler,
    load_optimizer: bool = True,
) -> None:
    """Restore a folder of :func:`save_sharded_state` (collective), resharding if the number
    of ranks changed. RNG states are restored only when it did not (they are per rank)."""
    path = Path(path)
    meta = read_fsdp_meta(path)
    model_state = get_model_state_dict(module)
    dcp.load(model_state, checkpoint_id=path / MODEL_DIR)
    set_model_state_dict(module, model_state)
    if not load_optimizer:
        return
    optim_state = get_optimizer_state_dict(module, optimizer)
    dcp.load(optim_state, checkpoint_id=path / OPTIM_DIR)
    set_optimizer_state_dict(module, optimizer, optim_state)
    rank, world_size = dist.get_rank(), dist.get_world_size()
    saved_world = int(meta["world_size"])  # type: ignore[call-overload]
    same_layout = saved_world == world_size
    extra_file = path / extra_state_file(rank if same_layout else 0, saved_world)
    extra = torch.load(extra_file, map_location="cpu", weights_only=True)
    lr_scheduler.load_state_dict(extra["lr_scheduler"])
    if same_layout:
        restore_rng_state(extra["rng"])


def read_full_model_state(path: str | os.PathLike) -> dict[str, torch.Tensor]:
    """Every full tensor of the model state in checkpoint folder ``path``, on the CPU.

    Runs in a plain process (no process group): DCP's metadata gives each tensor's global
    shape and dtype, and the per-rank files are read into full-size CPU tensors.
    """
    read_fsdp_meta(path)
    model_dir = Path(path) / MODEL_DIR
    metadata = FileSystemReader(str(model_dir)).read_metadata()
    state: dict[str, torch.Tensor] = {}
    for key, item in metadata.state_dict_metadata.items():
        if not isinstance(item, TensorStorageMetadata):
            raise ValueError(f"{model_dir}: entry {key!r} is not a tensor ({type(item).__name__})")
        state[key] = torch.empty(item.size, dtype=item.properties.dtype)
    with warnings.catch_warnings():  # DCP warns that it runs without a process group: intended here
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp.load(state, storage_reader=FileSystemReader(str(model_dir)), no_dist=True)
    return state
