"""Reloading a served model's weights from a Hugging Face folder (``/update_weights_from_disk``).

The folder's ``*.safetensors`` files are checked in full before anything is copied — every
name must be a tensor of the model with the same shape, every parameter of the model must be
covered (a tied LM head is covered by the embedding it shares storage with), and every value
must be finite once cast to the served dtype (a NaN or inf weight makes every later answer
garbage) — so a bad folder leaves the served weights untouched.

The server only reads folders inside the root it was started with (``--weights-root``):
:func:`folder_under_root` resolves a request's path (symlinks included) and refuses anything
outside, with one message for every path-related failure, so a client cannot probe which
paths exist on the server.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from torch import nn

NamedTensorPairs = Iterable[tuple[str, torch.Tensor]]


class WeightsRejected(ValueError):
    """The folder cannot replace the served weights; the message is safe to show a client."""


def not_a_model_folder(given: str) -> WeightsRejected:
    """The one answer to every path problem: missing, outside the root, not a folder, no weights."""
    return WeightsRejected(
        f"model_path {given!r} is not a folder of *.safetensors weights inside the server's weights root"
    )


def folder_under_root(root: str | os.PathLike, given: str) -> Path:
    """``given`` (relative to ``root``, or absolute) resolved; raises unless it lies inside ``root``.

    Resolution follows symlinks, so a link inside the root that points outside is refused too.
    Existence is not checked here: :func:`load_weights_from_folder` answers a missing folder
    with the same message.
    """
    base = Path(root).resolve()
    try:
        path = (base / Path(given).expanduser()).resolve()
    except (OSError, RuntimeError, ValueError) as err:  # symlink loops, NUL bytes
        raise not_a_model_folder(given) from err
    if not path.is_relative_to(base):
        raise not_a_model_folder(given)
    return path


def _safetensors_files(folder: Path, given: str) -> list[Path]:
    try:
        files = sorted(folder.glob("*.safetensors")) if folder.is_dir() else []
    except OSError as err:  # unreadable folder
        raise not_a_model_folder(given) from err
    if not files:
        raise not_a_model_folder(given)
    return files


def _shapes(files: list[Path]) -> dict[str, tuple[int, ...]]:
    shapes: dict[str, tuple[int, ...]] = {}
    for file in files:
        try:
            with safe_open(str(file), framework="pt") as fh:
                for name in fh.keys():  # noqa: SIM118 - safe_open objects are not iterable
                    shapes[name] = tuple(fh.get_slice(name).get_shape())
        except (SafetensorError, OSError) as err:
            raise WeightsRejected(f"{file.name}: not a readable safetensors file") from err
    return shapes


def check_folder_matches(model: nn.Module, shapes: dict[str, tuple[int, ...]]) -> None:
    """Raise :class:`WeightsRejected` naming the first problems when ``shapes`` cannot replace
    ``model``'s weights."""
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
        raise WeightsRejected("the folder does not match the served model: " + "; ".join(problems))


def check_finite(model: nn.Module, files: list[Path]) -> None:
    """Raise :class:`WeightsRejected` naming the tensors that hold NaN or inf in the served dtype.

    Read one tensor at a time (safetensors maps the file), cast as the copy will cast it: a
    finite fp32 value can still overflow a half-precision model.
    """
    targets = model.state_dict(keep_vars=True)
    bad: list[str] = []
    for file in files:
        try:
            with safe_open(str(file), framework="pt") as fh:
                for name in fh.keys():  # noqa: SIM118
                    tensor = fh.get_tensor(name)
                    if tensor.is_floating_point() and not bool(torch.isfinite(tensor.to(targets[name].dtype)).all()):
                        bad.append(name)
        except (SafetensorError, OSError) as err:
            raise WeightsRejected(f"{file.name}: not a readable safetensors file") from err
    if bad:
        raise WeightsRejected(f"the folder's weights are not finite (NaN or inf) in {len(bad)} tensors: {bad[:5]}")


def load_weights_from_folder(model: nn.Module, folder: str | os.PathLike, given: str | None = None) -> int:
    """Copy every tensor of ``folder``'s safetensors into ``model`` (cast to its dtype).

    Returns the number of tensors copied. Raises :class:`WeightsRejected` (before copying
    anything) when the folder is missing, unreadable, does not match the model, or holds
    non-finite values. ``given`` is the path as the client wrote it, for error messages
    (default: ``folder``).
    """
    given = os.fspath(folder) if given is None else given
    files = _safetensors_files(Path(folder), given)
    check_folder_matches(model, _shapes(files))
    check_finite(model, files)
    copied = 0
    device = next(model.parameters()).device
    for file in files:
        with safe_open(str(file), framework="pt", device=str(device)) as fh:
            pairs = ((name, fh.get_tensor(name)) for name in fh.keys())  # noqa: SIM118
            copied += load_named_tensors(model, pairs)
    return copied


def _pairs(weights: Mapping[str, torch.Tensor] | NamedTensorPairs) -> NamedTensorPairs:
    return weights.items() if isinstance(weights, Mapping) else weights


def load_named_tensors(model: nn.Module, weights: Mapping[str, torch.Tensor] | NamedTensorPairs) -> int:
    """Copy ``weights`` into ``model``'s parameters/buffers by ``state_dict`` name.

    Returns the number of tensors copied (a tensor that already is the target is skipped).
    Unknown names and shape mismatches raise ``ValueError`` naming the tensor.
    """
    targets = model.state_dict(keep_vars=True)
    copied = 0
    with torch.no_grad():
        for name, tensor in _pairs(weights):
            if name not in targets:
                suffix = ".".join(name.split(".")[-2:])
                close = [key for key in targets if key.endswith(suffix)]
                hint = f"; similar names: {close[:3]}" if close else ""
                raise ValueError(f"update_weights: the rollout model has no tensor named {name!r}{hint}")
            target = targets[name]
            if target.shape != tensor.shape:
                raise ValueError(
                    f"update_weights: {name!r} has shape {tuple(tensor.shape)}, "
                    f"the rollout model expects {tuple(target.shape)}"
                )
            if tensor is target or (tensor.data_ptr() == target.data_ptr() and tensor.dtype == target.dtype):
                continue
            # copy_ (not .data.copy_) bumps the version counter that packed weights watch.
            target.copy_(tensor)
            copied += 1
    return copied


def stage_named_tensors(
    model: nn.Module, named_tensors: Mapping[str, torch.Tensor] | NamedTensorPairs, *, require_all: bool = False
) -> dict[str, torch.Tensor]:
    """Check ``named_tensors`` against ``model`` and copy them to its device and dtypes.

    The copy is what an in-process weight transfer moves; the served weights are untouched
    until the engine swaps the staged tensors in (all of them, between two steps). Raises
    :class:`WeightsRejected` naming the tensor for an unknown name, a wrong shape, a non-finite
    value (after the cast) or, with ``require_all``, a parameter no tensor covers (a tied
    weight is covered by the one it shares storage with). Bucketed senders pass an iterator:
    one bucket at a time is held on the sender's side.
    """
    targets = model.state_dict(keep_vars=True)
    staged: dict[str, torch.Tensor] = {}
    for name, tensor in _pairs(named_tensors):
        target = targets.get(name)
        if target is None:
            suffix = ".".join(name.split(".")[-2:])
            close = [key for key in targets if key.endswith(suffix)]
            hint = f"; similar names: {close[:3]}" if close else ""
            raise WeightsRejected(f"update_weights: the served model has no tensor named {name!r}{hint}")
        if tuple(target.shape) != tuple(tensor.shape):
            raise WeightsRejected(
                f"update_weights: {name!r} has shape {tuple(tensor.shape)}, the served model expects {tuple(target.shape)}"
            )
        copy = tensor.detach().to(device=target.device, dtype=target.dtype, copy=True)
        if copy.is_floating_point() and not bool(torch.isfinite(copy).all()):
            raise WeightsRejected(f"update_weights: {name!r} holds NaN or inf (in {target.dtype})")
        staged[name] = copy
    if require_all:
        check_covers_parameters(model, staged)
    return staged


def check_covers_parameters(model: nn.Module, names: Iterable[str]) -> None:
    """Raise :class:`WeightsRejected` unless ``names`` cover every parameter of ``model`` (a
    tied weight is covered by the one it shares storage with) — after a level-2 sleep the
    weights hold garbage, so a partial update would serve it."""
    targets = model.state_dict(keep_vars=True)
    names = [n for n in names if n in targets]
    covered = {targets[name].data_ptr() for name in names}
    missing = [n for n, p in model.named_parameters() if n not in names and p.data_ptr() not in covered]
    if missing:
        raise WeightsRejected(
            f"update_weights: the weights were freed, so every parameter must be sent; missing {missing[:5]}"
        )


def free_parameters(model: nn.Module) -> dict[str, tuple[torch.Size, torch.dtype]]:
    """Release every parameter's storage (sleep level 2); returns the shapes to restore.

    Buffers stay: they are small and a trainer's weight push does not resend the non-persistent
    ones (rotary tables). Tied parameters are one ``Parameter`` and are freed once.
    """
    freed: dict[str, tuple[torch.Size, torch.dtype]] = {}
    for name, param in model.named_parameters():  # named_parameters yields a tied one once
        freed[name] = (param.shape, param.dtype)
        param.data = torch.empty(0, dtype=param.dtype, device=param.device)
    return freed


def restore_parameters(model: nn.Module, freed: Mapping[str, tuple[torch.Size, torch.dtype]]) -> None:
    """Re-allocate what :func:`free_parameters` released (uninitialised: load weights next)."""
    for name, param in model.named_parameters():
        shape, dtype = freed[name]
        param.data = torch.empty(shape, dtype=dtype, device=param.device)
