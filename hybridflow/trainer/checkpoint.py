"""Checkpoint layout, atomic commits, retention and resume lookup (verl's layout).

::

    {default_local_dir}/
      latest_checkpointed_iteration.txt     "N" — written after the commit, atomically
      global_step_N/
        actor/                              written by the actor worker group
        critic/                             written by the critic worker group (if any)
        controller_state.json               controller state: step, dataloader position, KL
                                            controller, RNG streams (JSON: data, never code)
        checkpoint_manifest.json            every file above with its size and sha256; written last

A checkpoint is first written to ``global_step_N.partial/``; every file and folder in it is
fsynced, the manifest is written, and the folder is renamed into place, so a crash or power
loss mid-save never leaves a folder that looks complete. Resuming checks the manifest: a
checkpoint whose files are missing, of the wrong size or of other content than was saved
(bytes overwritten in place: a disk error, a bad copy) is reported naming the file and, under
``resume_mode=auto``, skipped for the newest one that verifies. Checkpoints saved before the
manifest recorded checksums are checked by size only, with a note.

Checkpoints written before this format kept the controller state in a pickle (``data.pt``);
they are refused with a message naming :mod:`hybridflow.trainer.checkpoint_upgrade`, the
explicit command that converts them.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hybridflow.engine.checkpoint import atomic_write_text, file_sha256, fsync_dir, fsync_tree
from hybridflow.utils.errors import InputError

LATEST_FILE = "latest_checkpointed_iteration.txt"
STEP_DIR = re.compile(r"^global_step_(\d+)$")
CONTROLLER_STATE = "controller_state.json"
LEGACY_CONTROLLER_STATE = "data.pt"
MANIFEST_FILE = "checkpoint_manifest.json"
CHECKPOINT_FORMAT = "hybridflow-checkpoint"
CHECKPOINT_VERSION = 2
UPGRADE_COMMAND = "python -m hybridflow.trainer.checkpoint_upgrade"


class CheckpointError(InputError, ValueError):
    """A checkpoint folder is incomplete, damaged or not one; the message names the file."""


class LegacyCheckpointError(CheckpointError):
    """A checkpoint of the pickle format (``data.pt``) that only the upgrade command reads."""


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


def commit_checkpoint(paths: CheckpointPaths, step: int, keep: int | None, keep_critic: int | None = None) -> None:
    """Write the manifest, fsync, move the staged checkpoint into place, point ``latest`` at
    it, prune old ones: whole checkpoints beyond the newest ``keep``, and the ``critic/`` part
    of those beyond the newest ``keep_critic`` (verl's ``max_critic_ckpt_to_keep``)."""
    write_manifest(paths.staging, step)
    fsync_tree(paths.staging)
    old = None
    if paths.root.exists():  # the same step saved again (after a fallback): set the old one aside first
        old = Path(tempfile.mkdtemp(prefix=f".{paths.root.name}.old-", dir=paths.root.parent))
        os.replace(paths.root, old / paths.root.name)
    os.replace(paths.staging, paths.root)
    fsync_dir(paths.root.parent)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    atomic_write_text(paths.root.parent / LATEST_FILE, str(step))
    # Only steps up to this one count: later folders belong to a run that was rewound past
    # them (resumed from an older checkpoint) and are replaced when their step is saved again.
    earlier = [folder for s, folder in list_checkpoints(paths.root.parent) if s <= step]
    if keep is not None and keep > 0:
        for folder in earlier[:-keep]:
            shutil.rmtree(folder, ignore_errors=True)
        earlier = earlier[-keep:]
    if keep_critic is not None and keep_critic > 0:
        for folder in earlier[:-keep_critic]:
            drop_part(folder, "critic")


def drop_part(folder: Path, part: str) -> None:
    """Delete ``folder/part`` and take its files out of the manifest (listed under ``dropped``),
    so the checkpoint still verifies; resuming a run that needs the part says it is gone."""
    target = folder / part
    manifest_file = folder / MANIFEST_FILE
    if not target.is_dir() or not manifest_file.is_file():
        return
    manifest = json.loads(manifest_file.read_text(encoding="utf-8"))
    manifest["files"] = {name: size for name, size in manifest["files"].items() if not name.startswith(f"{part}/")}
    if isinstance(manifest.get("sha256"), dict):
        manifest["sha256"] = {name: h for name, h in manifest["sha256"].items() if name in manifest["files"]}
    manifest["dropped"] = sorted(set(manifest.get("dropped", [])) | {part})
    atomic_write_text(manifest_file, json.dumps(manifest, indent=1) + "\n")
    shutil.rmtree(target, ignore_errors=True)


def dropped_parts(path: Path) -> list[str]:
    """The parts retention removed from checkpoint ``path`` (e.g. ``["critic"]``)."""
    try:
        return list(json.loads((path / MANIFEST_FILE).read_text(encoding="utf-8")).get("dropped", []))
    except (OSError, ValueError):
        return []


def write_manifest(folder: Path, step: int) -> None:
    """``checkpoint_manifest.json``: every file under ``folder`` with its size in bytes and its
    sha256 (read back once here, streamed: about a second per 500 MB)."""
    names = [
        path.relative_to(folder).as_posix()
        for path in sorted(folder.rglob("*"))
        if path.is_file() and path.name != MANIFEST_FILE
    ]
    manifest = {
        "format": CHECKPOINT_FORMAT,
        "version": CHECKPOINT_VERSION,
        "step": step,
        "files": {name: (folder / name).stat().st_size for name in names},
        "sha256": {name: file_sha256(folder / name) for name in names},
    }
    atomic_write_text(folder / MANIFEST_FILE, json.dumps(manifest, indent=1) + "\n")


def verify_checkpoint(path: Path, part: str | None = None) -> bool:
    """Raise :class:`CheckpointError` naming the first missing, wrong-sized or altered file of
    ``path`` (:class:`LegacyCheckpointError` for a checkpoint of the pickle format).

    ``part`` (e.g. ``"actor"``) limits the check to the files under that sub-folder. Returns
    True when the contents were compared with recorded checksums, False for a manifest written
    before checksums were recorded (sizes only).
    """
    manifest_file = path / MANIFEST_FILE
    _require_file(path, manifest_file, f"{path} is not a complete checkpoint: {MANIFEST_FILE} is missing")
    try:
        manifest = json.loads(manifest_file.read_text(encoding="utf-8"))
        files = manifest["files"]
        hashes = manifest.get("sha256")
        ok = manifest.get("format") == CHECKPOINT_FORMAT and isinstance(files, dict)
        ok = ok and (hashes is None or isinstance(hashes, dict))
    except (ValueError, KeyError, TypeError, AttributeError, UnicodeDecodeError) as err:
        raise CheckpointError(f"{manifest_file} is damaged ({type(err).__name__}: {err})") from err
    if not ok:
        raise CheckpointError(f"{manifest_file} is not a hybridflow checkpoint manifest")
    names = [name for name in files if part is None or name.startswith(f"{part}/")]
    for name in names:  # sizes first: a missing or cut file is found without reading anything
        file = path / name
        if not file.is_file():
            raise CheckpointError(f"{file} is missing (listed in {MANIFEST_FILE})")
        if file.stat().st_size != files[name]:
            raise CheckpointError(f"{file} is damaged: {file.stat().st_size} bytes, {files[name]} when it was saved")
    if hashes is None:
        return False
    for name in names:
        if name not in hashes:
            raise CheckpointError(f"{manifest_file} records no checksum for {name}; the manifest was altered")
        if file_sha256(path / name) != hashes[name]:
            raise CheckpointError(
                f"{path / name} is damaged: its content differs from when it was saved (sha256 mismatch, "
                "same size: bytes overwritten in place)"
            )
    return True


def unverified_note(path: Path) -> str:
    """The note for a checkpoint whose manifest predates checksums."""
    return (
        f"note: {path} was saved by an older hybridflow without checksums; its files were checked by "
        "size only (content damage of the same size would go unnoticed)"
    )


def checkpoint_of(folder: Path) -> tuple[Path, str] | None:
    """``(global_step_N folder, part)`` when ``folder`` is a part of a committed checkpoint
    (``global_step_N/actor`` → ``(global_step_N, "actor")``), or ``(folder, "")`` for a
    ``global_step_N`` folder itself; None for any other folder."""
    if STEP_DIR.match(folder.name):
        return folder, ""
    if STEP_DIR.match(folder.parent.name):
        return folder.parent, folder.name
    return None


def _require_file(path: Path, file: Path, missing: str) -> None:
    """Raise when ``file`` of checkpoint folder ``path`` is absent: :class:`LegacyCheckpointError`
    when ``path`` is a checkpoint of the pickle format, else :class:`CheckpointError` (``missing``)."""
    if file.is_file():
        return
    if (path / LEGACY_CONTROLLER_STATE).is_file():
        raise LegacyCheckpointError(legacy_message(path))
    raise CheckpointError(missing)


def legacy_message(path: Path) -> str:
    return (
        f"{path / LEGACY_CONTROLLER_STATE} is a controller state of the old pickle format, which is not loaded "
        f"(unpickling can run code stored in the file). If you trust this checkpoint, convert it once with "
        f"`{UPGRADE_COMMAND} {path.parent}` (it reads tensors and plain values only), then resume"
    )


def list_checkpoints(default_local_dir: str | os.PathLike) -> list[tuple[int, Path]]:
    """Committed checkpoint folders, oldest first (staging folders are ignored; not verified)."""
    root = Path(default_local_dir)
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if p.is_dir() and (m := STEP_DIR.match(p.name))]
    return sorted(found)


def find_resume_checkpoint(
    default_local_dir: str | os.PathLike, resume_mode: str, resume_from_path: str | None
) -> Path | None:
    """The checkpoint folder to resume from, or None to start fresh.

    ``auto``: the newest complete checkpoint; a damaged newer one is reported and skipped.
    ``disable``: never; ``resume_path``: exactly ``resume_from_path`` (an error if damaged).
    """
    if resume_mode == "disable":
        return None
    if resume_mode == "resume_path":
        if not resume_from_path:
            raise ValueError("trainer.resume_mode=resume_path needs trainer.resume_from_path")
        path = Path(resume_from_path)
        if not STEP_DIR.match(path.name) or not path.is_dir():
            raise CheckpointError(f"trainer.resume_from_path={path} is not a complete global_step_N checkpoint folder")
        if not verify_checkpoint(path):
            print(f"resume: {unverified_note(path)}")
        return path
    if resume_mode != "auto":
        raise ValueError(f"trainer.resume_mode must be auto, disable or resume_path, got {resume_mode!r}")
    problems: list[str] = []
    for step, path in reversed(list_checkpoints(default_local_dir)):
        try:
            verified = verify_checkpoint(path)
        except LegacyCheckpointError:
            raise
        except CheckpointError as err:
            problems.append(f"step {step}: {err}")
            continue
        if problems:
            print(
                f"resume: skipping damaged checkpoint(s): {'; '.join(problems)}. "
                f"Resuming from {path}, the newest complete one"
            )
        if not verified:
            print(f"resume: {unverified_note(path)}")
        return path
    if problems:
        raise CheckpointError(
            f"no complete checkpoint in {default_local_dir}: {'; '.join(problems)}. "
            "Repair or move the damaged folders, or start over with trainer.resume_mode=disable"
        )
    return None


def step_of(path: Path) -> int:
    m = STEP_DIR.match(path.name)
    if not m:
        raise ValueError(f"{path} is not a global_step_N folder")
    return int(m.group(1))


# ---------------------------------------------------------------------------------- RNG state
def rng_state() -> dict[str, Any]:
    """Python, numpy and torch (CPU) RNG states as plain JSON values."""
    version, internal, gauss = random.getstate()
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    return {
        "python": {"version": version, "state": list(internal), "gauss_next": gauss},
        "numpy": {
            "kind": kind,
            "keys": [int(k) for k in keys],
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached),
        },
        "torch": bytes(torch.get_rng_state().tolist()).hex(),
    }


def set_rng_state(state: dict[str, Any]) -> None:
    """Inverse of :func:`rng_state`; a malformed state raises ``ValueError``/``TypeError``/``KeyError``."""
    py, npy = state["python"], state["numpy"]
    random.setstate((int(py["version"]), tuple(int(x) for x in py["state"]), py["gauss_next"]))
    keys = np.asarray([int(k) for k in npy["keys"]], dtype=np.uint32)
    np.random.set_state((str(npy["kind"]), keys, int(npy["pos"]), int(npy["has_gauss"]), float(npy["cached_gaussian"])))
    torch.set_rng_state(torch.tensor(list(bytes.fromhex(state["torch"])), dtype=torch.uint8))


# ---------------------------------------------------------------------------------- controller state
def save_controller_state(path: Path, state: dict[str, Any]) -> None:
    """``state`` (plain JSON values) to ``path`` atomically: temporary file, fsync, rename."""
    try:
        text = json.dumps({"format": CHECKPOINT_FORMAT, "version": CHECKPOINT_VERSION, **state})
    except TypeError as err:
        raise TypeError(f"controller state for {path} must hold plain JSON values: {err}") from err
    atomic_write_text(path, text + "\n")


def load_controller_state(path: Path, required: tuple[str, ...] = ("global_steps",)) -> dict[str, Any]:
    """The controller state of checkpoint folder ``path``; every ``required`` key must be there."""
    file = path / CONTROLLER_STATE
    _require_file(path, file, f"{file} is missing")
    try:
        state = json.loads(file.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as err:  # damaged, truncated, or not JSON at all
        raise CheckpointError(f"cannot read controller state {file}: {type(err).__name__}: {err}") from err
    if not isinstance(state, dict) or state.get("format") != CHECKPOINT_FORMAT:
        raise CheckpointError(f"{file} is not a hybridflow controller state (no format {CHECKPOINT_FORMAT!r})")
    missing = [key for key in required if key not in state]
    if missing:
        raise CheckpointError(f"{file} lacks {', '.join(missing)}")
    if not isinstance(state.get("global_steps"), int) or state["global_steps"] < 0:
        found = state.get("global_steps")
        raise CheckpointError(f"{file}: global_steps must be a non-negative integer, found {found!r}")
    return state


def restore_entry(checkpoint: Path, state: dict[str, Any], key: str, load: Callable[[Any], None]) -> None:
    """``load(state[key])``; a malformed or mismatching entry is reported with the file and key."""
    try:
        load(state[key])
    except (KeyError, ValueError, TypeError, IndexError) as err:
        raise CheckpointError(f"{checkpoint / CONTROLLER_STATE}: entry {key!r} cannot be restored: {err}") from err
