"""Engine checkpoints: weights (safetensors), optimizer, scheduler and RNG states.

Layout of one engine checkpoint folder::

    model.safetensors   the module's state dict (tied tensors stored once)
    optimizer.pt        optimizer.state_dict()
    extra_state.pt      {"lr_scheduler": ..., "rng": {...}, "format": 1}

The folder is written under a temporary name next to the target and renamed into place, so
a crash mid-save never leaves a half checkpoint where a complete one is expected.
"""

from __future__ import annotations

import os
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

MODEL_FILE = "model.safetensors"
OPTIMIZER_FILE = "optimizer.pt"
EXTRA_STATE_FILE = "extra_state.pt"
CHECKPOINT_FORMAT = 1


@contextmanager
def atomic_directory(path: str | os.PathLike) -> Iterator[Path]:
    """Yield an empty temporary folder; on success it replaces ``path`` in one rename.

    An existing ``path`` is moved aside first and deleted only after the new folder is in
    place. On error the temporary folder is removed and ``path`` is left untouched.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.tmp-", dir=path.parent))
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    old = None
    if path.exists():
        old = Path(tempfile.mkdtemp(prefix=f".{path.name}.old-", dir=path.parent))
        os.replace(path, old / path.name)
    os.replace(tmp, path)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def capture_rng_state() -> dict[str, Any]:
    """Global RNG states of torch (CPU and CUDA), numpy and Python's ``random``."""
    kind, keys, pos, has_gauss, cached = np.random.get_state()
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
    """Restore what :func:`save_engine_state` wrote (weights always; the rest if asked)."""
    path = Path(path)
    missing = [f for f in (MODEL_FILE, OPTIMIZER_FILE, EXTRA_STATE_FILE) if not (path / f).is_file()]
    if missing:
        raise FileNotFoundError(f"engine checkpoint {path} is incomplete: missing {', '.join(missing)}")
    try:
        load_model(module, str(path / MODEL_FILE), strict=True)
    except Exception as err:  # safetensors raises its own error type for corrupt files
        raise RuntimeError(f"could not load weights from {path / MODEL_FILE}: {err}") from err
    if not load_optimizer:
        return
    optimizer.load_state_dict(torch.load(path / OPTIMIZER_FILE, map_location="cpu", weights_only=True))
    extra = torch.load(path / EXTRA_STATE_FILE, map_location="cpu", weights_only=True)
    if extra["format"] != CHECKPOINT_FORMAT:
        raise ValueError(f"engine checkpoint {path} has format {extra['format']}, expected {CHECKPOINT_FORMAT}")
    lr_scheduler.load_state_dict(extra["lr_scheduler"])
    restore_rng_state(extra["rng"])
