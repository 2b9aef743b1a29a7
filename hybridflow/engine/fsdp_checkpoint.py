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

Reading never runs code from the folder: DCP's own reader unpickles ``.metadata`` with plain
``pickle`` and non-tensor entries (the optimizer's ``param_groups``) with
``torch.load(weights_only=False)``. :class:`SafeFileSystemReader` unpickles ``.metadata`` with
an allow-list of DCP's metadata classes, :class:`SafeLoadPlanner` reads the other entries with
``weights_only=True``, and the extra-state files go through :func:`load_torch_data`.
"""

from __future__ import annotations

import io
import json
import os
import pathlib
import pickle
import warnings
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint import metadata as dcp_metadata
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta, TensorStorageMetadata
from torch.distributed.checkpoint.planner import ReadItem
from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from hybridflow.engine.checkpoint import (
    CheckpointFileError,
    atomic_directory,
    capture_rng_state,
    load_torch_data,
    restore_rng_state,
)
from hybridflow.utils.distributed import barrier, broadcast_object

FSDP_META_FILE = "fsdp_meta.json"
FSDP_FORMAT = "hybridflow-fsdp"
FSDP_FORMAT_VERSION = 1
MODEL_DIR = "model"
OPTIM_DIR = "optim"


# What a DCP ``.metadata`` pickle may name: DCP's own metadata records, shapes, dtypes and paths.
_DCP_METADATA_CLASSES = {
    "Metadata",
    "MetadataIndex",
    "StorageMeta",
    "ChunkStorageMetadata",
    "TensorStorageMetadata",
    "BytesStorageMetadata",
    "TensorProperties",
    "_MEM_FORMAT_ENCODING",
}
_ALLOWED_GLOBALS = {
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("torch.serialization", "_get_layout"),
    ("torch", "Size"),
    ("collections", "OrderedDict"),
    *(("pathlib", name) for name in ("Path", "PosixPath", "PurePosixPath", "WindowsPath", "PureWindowsPath")),
}


class _MetadataUnpickler(pickle.Unpickler):
    """Resolves only the names a DCP metadata file needs; any other global is refused."""

    def find_class(self, module: str, name: str) -> Any:
        if module == "torch.distributed.checkpoint.metadata" and name in _DCP_METADATA_CLASSES:
            return getattr(dcp_metadata, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        if (module, name) in _ALLOWED_GLOBALS:
            if module == "pathlib":
                return getattr(pathlib, name)
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"global {module}.{name} is not allowed in a checkpoint's metadata")


class SafeFileSystemReader(FileSystemReader):
    """DCP's file reader, but ``.metadata`` is unpickled with an allow-list (no code runs)."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        file = Path(self.path) / ".metadata"
        try:
            with open(file, "rb") as f:
                metadata = _MetadataUnpickler(f).load()
        except FileNotFoundError as err:
            raise CheckpointFileError(file, "missing") from err
        except pickle.UnpicklingError as err:
            raise CheckpointFileError(file, f"refused: {err}; loading it could run code") from err
        except (EOFError, OSError, ValueError, TypeError, AttributeError) as err:
            raise CheckpointFileError(file, f"damaged or truncated ({type(err).__name__}: {err})") from err
        if not isinstance(metadata, Metadata):
            raise CheckpointFileError(file, f"holds a {type(metadata).__name__}, not DCP metadata")
        storage_meta = getattr(metadata, "storage_meta", None)  # absent in metadata written by older torch
        if storage_meta is None:
            storage_meta = metadata.storage_meta = StorageMeta()
        storage_meta.load_id = self.load_id
        return metadata


class SafeLoadPlanner(DefaultLoadPlanner):
    """DCP's load planner, but non-tensor entries are read with ``weights_only=True``."""

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        try:
            obj = torch.load(value, weights_only=True)
        except pickle.UnpicklingError as err:
            raise CheckpointFileError(
                f"{read_item.storage_index.fqn} (a non-tensor checkpoint entry)",
                f"refused: it holds Python objects other than plain data ({str(err).splitlines()[0]})",
            ) from err
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], obj)
        else:
            self.state_dict[read_item.dest_index.fqn] = obj


def _dcp_load(state: dict[str, Any], folder: Path, no_dist: bool = False) -> None:
    """``dcp.load`` through the safe reader and planner; errors name the folder (or the file)."""
    reader = SafeFileSystemReader(str(folder))
    try:
        dcp.load(state, storage_reader=reader, planner=SafeLoadPlanner(), no_dist=no_dist)
    except CheckpointFileError:
        raise
    except (Exception, CheckpointException) as err:  # DCP wraps per-rank failures (a BaseException)
        for failure in getattr(err, "failures", {}).values():
            cause = failure[0] if isinstance(failure, tuple) else failure
            if isinstance(cause, CheckpointFileError):
                raise cause from err
        raise CheckpointFileError(folder, f"could not read the sharded state ({type(err).__name__}: {err})") from err


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
    _dcp_load(model_state, path / MODEL_DIR)
    set_model_state_dict(module, model_state)
    if not load_optimizer:
        return
    optim_state = get_optimizer_state_dict(module, optimizer)
    _dcp_load(optim_state, path / OPTIM_DIR)
    set_optimizer_state_dict(module, optimizer, optim_state)
    rank, world_size = dist.get_rank(), dist.get_world_size()
    saved_world = int(meta["world_size"])  # type: ignore[call-overload]
    same_layout = saved_world == world_size
    extra_file = path / extra_state_file(rank if same_layout else 0, saved_world)
    extra = load_torch_data(extra_file)
    if not isinstance(extra, dict) or not {"lr_scheduler", "rng"} <= extra.keys():
        raise CheckpointFileError(extra_file, "is not an extra-state file (needs lr_scheduler and rng)")
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
    metadata = SafeFileSystemReader(str(model_dir)).read_metadata()
    state: dict[str, torch.Tensor] = {}
    for key, item in metadata.state_dict_metadata.items():
        if not isinstance(item, TensorStorageMetadata):
            raise ValueError(f"{model_dir}: entry {key!r} is not a tensor ({type(item).__name__})")
        state[key] = torch.empty(item.size, dtype=item.properties.dtype)
    with warnings.catch_warnings():  # DCP warns that it runs without a process group: intended here
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        _dcp_load(state, model_dir, no_dist=True)
    return state
