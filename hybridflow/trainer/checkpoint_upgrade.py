"""``python -m hybridflow.trainer.checkpoint_upgrade PATH``: convert checkpoints of the old
pickle format to the current one — the explicit opt-in for checkpoints written before it.

Old checkpoints kept the controller state (step, data position, KL controller, RNG streams)
in ``global_step_N/data.pt``, a pickle that training no longer loads. This command reads it
with ``torch.load(weights_only=True)``, allowing exactly numpy's array reconstruction (the old
state held numpy's RNG keys as an array) besides tensors and plain containers, so nothing
stored in the file can run; a file that needs anything else is refused. It then writes
``controller_state.json`` and ``checkpoint_manifest.json`` next to it. ``data.pt`` is left in
place. ``PATH`` is a run folder (every old-format ``global_step_N`` in it) or one
``global_step_N`` folder. Exit status: 0 converted (or nothing to do), 2 refused.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hybridflow.engine.checkpoint import CheckpointFileError
from hybridflow.trainer import checkpoint as ckpt

try:  # numpy ≥ 2 moved the module; old pickles may name either
    from numpy._core.multiarray import _reconstruct
except ImportError:  # pragma: no cover - numpy 1.x
    from numpy.core.multiarray import _reconstruct  # type: ignore[no-redef]

# The only globals besides torch's own that an old data.pt needs: numpy's RNG key array.
_NUMPY_ARRAY_GLOBALS: list[Any] = [
    np.ndarray,
    np.dtype,
    type(np.dtype(np.uint32)),
    (_reconstruct, "numpy._core.multiarray._reconstruct"),
    (_reconstruct, "numpy.core.multiarray._reconstruct"),
]


def read_legacy_state(file: Path) -> dict[str, Any]:
    """The old ``data.pt`` as plain values; refused (never executed) if it holds anything else."""
    try:
        with torch.serialization.safe_globals(_NUMPY_ARRAY_GLOBALS):
            state = torch.load(file, map_location="cpu", weights_only=True)
    except Exception as err:  # UnpicklingError for a refused global, zip errors for a damaged file
        first = (str(err).strip().splitlines() or [type(err).__name__])[0]
        problem = f"refused or unreadable, not converted ({type(err).__name__}: {first})"
        raise CheckpointFileError(file, problem) from err
    if not isinstance(state, dict) or "global_steps" not in state or "rng" not in state:
        raise CheckpointFileError(file, "is not a controller state (needs global_steps and rng)")
    return state


def convert_rng(file: Path, rng: Any) -> dict[str, Any]:
    """The old RNG entry (tuples, a numpy array, a tensor) in the JSON form of :func:`ckpt.rng_state`."""
    try:
        version, internal, gauss = rng["python"]
        kind, keys, pos, has_gauss, cached = rng["numpy"]
        keys = np.asarray(keys)
        if keys.dtype.kind not in "iu" or keys.shape != (624,):
            raise ValueError(f"numpy keys of dtype {keys.dtype} and shape {keys.shape}")
        torch_state = rng["torch"]
        if not isinstance(torch_state, torch.Tensor) or torch_state.dtype != torch.uint8:
            raise ValueError("the torch RNG state is not a uint8 tensor")
        return {
            "python": {
                "version": int(version),
                "state": [int(x) for x in internal],
                "gauss_next": None if gauss is None else float(gauss),
            },
            "numpy": {
                "kind": str(kind),
                "keys": [int(k) for k in keys],
                "pos": int(pos),
                "has_gauss": int(has_gauss),
                "cached_gaussian": float(cached),
            },
            "torch": bytes(torch_state.tolist()).hex(),
        }
    except (KeyError, TypeError, ValueError) as err:
        raise CheckpointFileError(file, f"the rng entry is malformed ({type(err).__name__}: {err})") from err


def upgrade_checkpoint(path: Path) -> Path:
    """Write ``controller_state.json`` and the manifest for one old-format ``global_step_N`` folder."""
    file = path / ckpt.LEGACY_CONTROLLER_STATE
    state = read_legacy_state(file)
    converted = {key: value for key, value in state.items() if key != "rng"}
    converted["rng"] = convert_rng(file, state["rng"])
    try:
        ckpt.save_controller_state(path / ckpt.CONTROLLER_STATE, converted)
    except TypeError as err:  # something other than plain values: not a state this code wrote
        raise CheckpointFileError(file, f"holds values that are not plain data: {err}") from err
    ckpt.write_manifest(path, ckpt.step_of(path))
    return path


def legacy_checkpoints(path: Path) -> list[Path]:
    """The old-format checkpoint folders at ``path`` (a run folder or one step folder)."""
    folders = [path] if ckpt.STEP_DIR.match(path.name) else [p for _, p in ckpt.list_checkpoints(path)]
    return [
        f for f in folders if (f / ckpt.LEGACY_CONTROLLER_STATE).is_file() and not (f / ckpt.MANIFEST_FILE).is_file()
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m hybridflow.trainer.checkpoint_upgrade",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("path", type=Path, help="run folder or global_step_N folder")
    args = parser.parse_args(argv)
    if not args.path.is_dir():
        print(f"checkpoint_upgrade: {args.path} is not a folder", file=sys.stderr)
        return 2
    folders = legacy_checkpoints(args.path)
    if not folders:
        print(f"{args.path}: no checkpoint of the old format (global_step_N/data.pt without a manifest)")
        return 0
    for folder in folders:
        try:
            upgrade_checkpoint(folder)
        except CheckpointFileError as err:
            print(f"checkpoint_upgrade: {err}", file=sys.stderr)
            return 2
        print(f"converted {folder}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
