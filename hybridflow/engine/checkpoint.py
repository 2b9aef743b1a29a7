"""Engine checkpoints: weights (safetensors), optimizer, scheduler and RNG states.

Layout of one engine checkpoint folder::

    model.safetensors   the module's state dict (tied tensors stored once)
    optimizer.pt        optimizer.state_dict()
    extra_state.pt      {"lr_scheduler": ..., "rng": {...}, "format": 1}

The folder is written under a temporary name next to the target, fsynced, and renamed into
place, so a crash (or power loss) mid-save never leaves a half checkpoint where a complete one
is expected.

A checkpoint is data, never code: the ``.pt`` files are read only with
``torch.load(weights_only=True)`` (:func:`load_torch_data`), which accepts tensors and plain
containers and refuses any other Python object, so a planted pickle cannot run anything. Every
load error names the file.
"""

from __future__ import annotations

import hashlib
import os
import pickle
import random
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_model, save_model

from hybridflow.utils.errors import InputError

MODEL_FILE = "model.safetensors"
OPTIMIZER_FILE = "optimizer.pt"
EXTRA_STATE_FILE = "extra_state.pt"
CHECKPOINT_FORMAT = 1


class CheckpointFileError(InputError, RuntimeError):
    """A checkpoint file is missing, damaged, truncated or holds more than plain data.

    ``path`` is the file; the message names it and says what is wrong.
    """

    def __init__(self, path: str | os.PathLike, problem: str) -> None:
        self.path = Path(path)
        super().__init__(f"{self.path}: {problem}")


def fsync_file(path: str | os.PathLike) -> None:
    """Flush a file's data to the disk (a rename after this never exposes a short file)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: str | os.PathLike) -> None:
    """Flush a folder's entries (the names created or renamed in it) to the disk."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:  # a platform where folders cannot be opened: nothing to flush
        return
    try:
        os.fsync(fd)
    except OSError:  # some file systems refuse fsync on a folder; the data is still written
        pass
    finally:
        os.close(fd)


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` to a temporary file, fsync it, rename it over ``path``, fsync the folder."""
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)


def fsync_tree(path: str | os.PathLike[str]) -> None:
    """fsync every file and folder under ``path`` (deepest first), then ``path`` itself."""
    for root, _, files in os.walk(path, topdown=False):
        for name in files:
            fsync_file(os.path.join(root, name))
        fsync_dir(root)


def file_sha256(path: str | os.PathLike, chunk_bytes: int = 1 << 20) -> str:
    """The sha256 of a file's bytes as hex, read in chunks (a checkpoint of any size, little memory)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(chunk_bytes):
            digest.update(chunk)
    return digest.hexdigest()


def pickle_refusal(err: pickle.UnpicklingError) -> str:
    """What a file refused by a ``weights_only`` load is reported with (after its path).

    torch's own message opens by suggesting ``weights_only=False``, the very thing that would run
    the planted code, so the line naming the refused global is shown instead when there is one.
    """
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    reason = next((line for line in lines if "GLOBAL" in line or "global" in line), lines[0] if lines else "")
    return (
        "refused: it holds Python objects other than tensors and plain containers, and loading them "
        f"could run code ({reason or type(err).__name__})"
    )


def save_torch_data(obj: Any, path: str | os.PathLike) -> None:
    """``torch.save`` to a temporary name, fsync, rename: a reader sees the old file or the whole new one."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    torch.save(obj, tmp)
    fsync_file(tmp)
    os.replace(tmp, path)


def load_torch_data(path: str | os.PathLike) -> Any:
    """A ``.pt`` file's tensors and plain containers; never runs code stored in it.

    Raises :class:`CheckpointFileError` naming the file when it is missing, truncated or
    damaged, or when it holds other Python objects (refused, not executed).
    """
    path = Path(path)
    if not path.is_file():
        raise CheckpointFileError(path, "missing")
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        raise CheckpointFileError(path, pickle_refusal(err)) from err
    except (RuntimeError, EOFError, OSError, ValueError) as err:  # zip reader errors of a truncated file
        raise CheckpointFileError(path, f"damaged or truncated ({type(err).__name__}: {err})") from err


@contextmanager
def atomic_directory(path: str | os.PathLike) -> Iterator[Path]:
    """Yield an empty temporary folder; on success it replaces ``path`` in one rename.

    The folder's files are fsynced before the rename and the parent folder after it. An
    existing ``path`` is moved aside first and deleted only after the new folder is in place.
    On error the temporary folder is removed and ``path`` is left untouched. For internal
    checkpoint folders only: it replaces whatever ``path`` holds.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.tmp-", dir=path.parent))
    try:
        yield tmp
        fsync_tree(tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    old = None
    if path.exists():
        old = Path(tempfile.mkdtemp(prefix=f".{path.name}.old-", dir=path.parent))
        os.replace(path, old / path.name)
    os.replace(tmp, path)
    fsync_dir(path.parent)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def capture_rng_state() -> dict[str, Any]:
    """Global RNG states of torch (CPU and CUDA), numpy and Python's ``random``: tensors and
    plain values only, so the state loads with ``weights_only=True``."""
    np_state = np.random.get_state(legacy=True)  # the default; numpy's stubs type the bare call as the dict form
    assert isinstance(np_state, tuple), "numpy's global RandomState is not an MT19937"
    kind, keys, pos, has_gauss, cached = np_state
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "numpy": (kind, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, cached),
        "python": random.getstate(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng_state(state: dict[str, Any]) -> None:
    """Inverse of :func:`capture_rng_state`."""
    torch.set_rng_state(state["torch"])
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_engine_state(
    path: str | os.PathLike,
    module: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    lr_scheduler: torch.optim.lr_scheduler.LRScheduler,
) -> Path:
    """Write an engine checkpoint folder at ``path`` (atomically) and return it."""
    with atomic_directory(path) as tmp:
        save_model(module, str(tmp / MODEL_FILE))
        torch.save(optimizer.state_dict(), tmp / OPTIMIZER_FILE)
        extra = {"format": CHECKPOINT_FORMAT, "lr_scheduler": lr_scheduler.state_dict(), "rng": capture_rng_state()}
        torch.save(extra, tmp / EXTRA_STATE_FILE)
    return Path(path)


def load_engine_state(
    path: str | os.PathLike,
    module: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    lr_scheduler: torch.optim.lr_scheduler.LRScheduler,
    load_optimizer: bool = True,
) -> None:
    """Restore what :func:`save_engine_state` wrote (weights always; the rest if asked).

    Every file is read (and checked) before any state changes, so a damaged optimizer or
    extra-state file leaves the module as it was.
    """
    path = Path(path)
    missing = [f for f in (MODEL_FILE, OPTIMIZER_FILE, EXTRA_STATE_FILE) if not (path / f).is_file()]
    if missing:
        raise FileNotFoundError(f"engine checkpoint {path} is incomplete: missing {', '.join(missing)}")
    optim_state = extra = None
    if load_optimizer:
        optim_state = load_torch_data(path / OPTIMIZER_FILE)
        extra = _read_extra_state(path / EXTRA_STATE_FILE)
    try:
        load_model(module, str(path / MODEL_FILE), strict=True)
    except Exception as err:  # safetensors raises its own error type for corrupt files
        raise CheckpointFileError(path / MODEL_FILE, f"could not load weights: {err}") from err
    if optim_state is None or extra is None:
        return
    _apply(path / OPTIMIZER_FILE, optimizer.load_state_dict, optim_state)
    _apply(path / EXTRA_STATE_FILE, lr_scheduler.load_state_dict, extra["lr_scheduler"])
    _apply(path / EXTRA_STATE_FILE, restore_rng_state, extra["rng"])


def _read_extra_state(file: Path) -> dict[str, Any]:
    extra = load_torch_data(file)
    if not isinstance(extra, dict) or extra.get("format") != CHECKPOINT_FORMAT:
        found = extra.get("format") if isinstance(extra, dict) else type(extra).__name__
        raise CheckpointFileError(file, f"has format {found!r}, expected {CHECKPOINT_FORMAT}")
    missing = [k for k in ("lr_scheduler", "rng") if k not in extra]
    if missing:
        raise CheckpointFileError(file, f"lacks {', '.join(missing)}")
    return extra


def _apply(file: Path, load: Any, state: Any) -> None:
    """``load(state)``, with a state that does not fit reported against the file it came from."""
    try:
        load(state)
    except (KeyError, ValueError, TypeError, RuntimeError, IndexError) as err:
        raise CheckpointFileError(file, f"does not fit this run ({type(err).__name__}: {err})") from err
