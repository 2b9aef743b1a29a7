"""Checkpoint layout, atomic commits, retention and resume lookup (verl's layout).

::

    {default_local_dir}/
      latest_checkpointed_iteration.txt     "N" — written last, atomically
      global_step_N/
        actor/                              written by the actor worker group
        critic/                             written by the critic worker group (if any)
        data.pt                             controller state: dataloader position, step, KL
                                            controller, RNG streams

A checkpoint is first written to ``global_step_N.partial/`` and renamed into place only when
every part is on disk, so a crash mid-save never leaves a folder that looks complete.
"""

from __future__ import annotations

import os
import random
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

LATEST_FILE = "latest_checkpointed_iteration.txt"
STEP_DIR = re.compile(r"^global_step_(\d+)$")
CONTROLLER_STATE = "data.pt"


@dataclass(frozen=True)
class CheckpointPaths:
    root: Path  # the final global_step_N folder
    staging: Path  # where parts are written before the commit

    @property
    def actor(self) -> Path:
        return self.staging / "actor"

    @property
    def critic(self) -> Path:
        return self.staging / "critic"

    @property
    def controller_state(self) -> Path:
        return self.staging / CONTROLLER_STATE


def begin_checkpoint(default_local_dir: str | os.PathLike, step: int) -> CheckpointPaths:
    root = Path(default_local_dir) / f"global_step_{step}"
    staging = root.with_name(root.name + ".partial")
    if staging.exists():
        shutil.rmtree(staging)  # left over by a crash during an earlier save of this step
    staging.mkdir(parents=True)
    return CheckpointPaths(root=root, staging=staging)


def commit_checkpoint(paths: CheckpointPaths, step: int, keep: int | None) -> None:
    """Move the staged checkpoint into place, point ``latest`` at it, prune old ones."""
    if paths.root.exists():
        shutil.rmtree(paths.root)
    os.replace(paths.staging, paths.root)
    _atomic_write_text(paths.root.parent / LATEST_FILE, str(step))
    if keep is not None and keep > 0:
        for old in list_checkpoints(paths.root.parent)[:-keep]:
            shutil.rmtree(old[1], ignore_errors=True)


def list_checkpoints(default_local_dir: str | os.PathLike) -> list[tuple[int, Path]]:
    """Complete checkpoints, oldest first (staging folders are ignored)."""
    root = Path(default_local_dir)
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if p.is_dir() and (m := STEP_DIR.match(p.name))]
    return sorted(found)


def find_resume_checkpoint(default_local_dir: str | os.PathLike, resume_mode: str, resume_from_path: str | None) -> Path | None:
    """The checkpoint folder to resume from, or None to start fresh.

    ``auto``: the step named in latest_checkpointed_iteration.txt (falling back to the newest
    complete folder); ``disable``: never; ``resume_path``: exactly ``resume_from_path``.
    """
    if resume_mode == "disable":
        return None
    if resume_mode == "resume_path":
        if not resume_from_path:
            raise ValueError("trainer.resume_mode=resume_path needs trainer.resume_from_path")
        path = Path(resume_from_path)
        if not STEP_DIR.match(path.name) or not (path / CONTROLLER_STATE).is_file():
            raise ValueError(f"trainer.resume_from_path={path} is not a complete global_step_N checkpoint folder")
        return path
    if resume_mode != "auto":
        raise ValueError(f"trainer.resume_mode must be auto, disable or resume_path, got {resume_mode!r}")
    root = Path(default_local_dir)
    latest = root / LATEST_FILE
    if latest.is_file():
        text = latest.read_text().strip()
        if not text.isdigit():
            raise ValueError(f"{latest} is corrupt: expected a step number, found {text!r}")
        path = root / f"global_step_{text}"
        if (path / CONTROLLER_STATE).is_file():
            return path
    complete = [p for _, p in list_checkpoints(root) if (p / CONTROLLER_STATE).is_file()]
    return complete[-1] if complete else None


def step_of(path: Path) -> int:
    m = STEP_DIR.match(path.name)
    if not m:
        raise ValueError(f"{path} is not a global_step_N folder")
    return int(m.group(1))


def rng_state() -> dict[str, Any]:
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])


def save_controller_state(path: Path, state: dict[str, Any]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)


def load_controller_state(path: Path) -> dict[str, Any]:
    file = path / CONTROLLER_STATE
    try:
        return torch.load(file, weights_only=False)
    except Exception as e:  # corrupt or truncated file: name it
        raise ValueError(f"cannot read controller state {file}: {type(e).__name__}: {e}") from e


def _atomic_write_text(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
