"""Reloading a served model's weights from a Hugging Face folder (``/update_weights_from_disk``).

The folder's ``*.safetensors`` files are checked in full before anything is copied — every
name must be a tensor of the model with the same shape, and every parameter of the model must
be covered (a tied LM head is covered by the embedding it shares storage with) — so a bad
folder leaves the served weights untouched.
"""

from __future__ import annotations

import os
from pathlib import Path

from safetensors import SafetensorError, safe_open
from torch import nn

from hybridflow.workers.rollout.weight_sync import load_named_tensors


def _safetensors_files(folder: Path) -> list[Path]:
    if not folder.is_dir():
        raise ValueError(f"model_path {str(folder)!r} is not a folder")
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise ValueError(f"model_path {str(folder)!r} holds no *.safetensors files")
    return files


def _shapes(files: list[Path]) -> dict[str, tuple[int, ...]]:
    shapes: dict[str, tuple[int, ...]] = {}
    for file in files:
        try:
            with safe_open(str(file), framework="pt") as fh:
                for name in fh.keys():  # noqa: SIM118 - safe_open objects are not iterable
                    shapes[name] = tuple(fh.get_slice(name).get_shape())
        except (SafetensorError, OSError) as err:
            raise ValueError(f"{file}: not a readable safetensors file: {err}") from err
    return shapes


def check_folder_matches(model: nn.Module, shapes: dict[str, tuple[int, ...]]) -> None:
    """Raise ``ValueError`` naming the first problems when ``shapes`` cannot replace ``model``'s weights."""
    targets = model.state_dict(keep_vars=True)
    unknown = [name for name in shapes if name not in targets]
    wrong = [
        f"{name} {shapes[name]} (model: {tuple(targets[name].shape)})"
        for name in shapes
        if name in targets and tuple(targets[name].shape) != shapes[name]
    ]
    covered = {targets[name].data_ptr() for name in shapes if name in targets}
    missing = [name for name, t in targets.items() if name not in shapes and t.data_ptr() not in covered]
    problems = []
    if unknown:
        problems.append(f"tensors the model does not have: {unknown[:5]}")
    if wrong:
        problems.append(f"shape mismatches: {wrong[:5]}")
    if missing:
        problems.append(f"model tensors missing from the folder: {missing[:5]}")
    if problems:
        raise ValueError("the folder does not match the served model: " + "; ".join(problems))


def load_weights_from_folder(model: nn.Module, folder: str | os.PathLike) -> int:
    """Copy every tensor of ``folder``'s safetensors into ``model`` (cast to its dtype).

    Returns the number of tensors copied. Raises ``ValueError`` (before copying anything) when
    the folder is missing, unreadable, or does not match the model.
    """
    files = _safetensors_files(Path(folder).expanduser())
    check_folder_matches(model, _shapes(files))
    copied = 0
    device = next(model.parameters()).device
    for file in files:
        with safe_open(str(file), framework="pt", device=str(device)) as fh:
            pairs = ((name, fh.get_tensor(name)) for name in fh.keys())  # noqa: SIM118
            copied += load_named_tensors(model, pairs)
    return copied

