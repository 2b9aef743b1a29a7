"""``hybridflow export test``'s comparison: a checkpoint or exported folder against a reference folder.

Tensor by tensor: the same names, the same shapes, values within ``|a - b| ≤ atol + rtol·|b|``
(computed in fp32). A candidate may be an exported folder or a checkpoint (merged in memory
first). Full models are compared as ``from_pretrained`` loads them (so sharding, ``.bin`` vs
safetensors and tied weights do not matter): ``AutoModelForCausalLM``, or
``AutoModelForImageTextToText`` for a vision-language folder (Qwen2-VL); adapter folders by their
``adapter_model`` tensors.
"""

from __future__ import annotations

import os
import pickle
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from hybridflow.engine.checkpoint import pickle_refusal
from hybridflow.export.reader import (
    CheckpointError,
    build_model,
    locate_checkpoint,
    merged_model,
)
from hybridflow.models.hf_metadata import ADAPTER_CONFIG_FILE, CONFIG_FILE
from hybridflow.models.loader import (
    WEIGHT_LOAD_ERRORS,
    causal_lm_auto_class,
    is_vision_language_folder,
    weights_load_error,
)

ADAPTER_WEIGHT_FILES: tuple[str, ...] = ("adapter_model.safetensors", "adapter_model.bin")


@dataclass(frozen=True)
class Comparison:
    """Differences between a candidate and a reference state dict."""

    compared: int
    missing: list[str] = field(default_factory=list)  # in the reference only
    unexpected: list[str] = field(default_factory=list)  # in the candidate only
    shape_mismatch: list[str] = field(default_factory=list)
    value_mismatch: list[tuple[str, float]] = field(default_factory=list)  # (name, max |a - b|)

    @property
    def ok(self) -> bool:
        return not (self.missing or self.unexpected or self.shape_mismatch or self.value_mismatch)


def compare_state_dicts(
    candidate: dict[str, torch.Tensor], reference: dict[str, torch.Tensor], atol: float = 1e-6, rtol: float = 1e-5
) -> Comparison:
    """Name, shape and value comparison (values in fp32: ``|a - b| ≤ atol + rtol·|b|``)."""
    shapes, values = [], []
    common = [n for n in reference if n in candidate]
    for name in common:
        a, b = candidate[name], reference[name]
        if a.shape != b.shape:
            shapes.append(f"{name}: {tuple(a.shape)} vs {tuple(b.shape)}")
            continue
        a32, b32 = a.detach().float(), b.detach().float()
        if not torch.allclose(a32, b32, atol=atol, rtol=rtol):
            values.append((name, float((a32 - b32).abs().max())))
    return Comparison(
        compared=len(common),
        missing=[n for n in reference if n not in candidate],
        unexpected=[n for n in candidate if n not in reference],
        shape_mismatch=shapes,
        value_mismatch=values,
    )


def format_comparison(result: Comparison) -> str:
    if result.ok:
        return f"OK: {result.compared} tensors match (names, shapes, values)"
    lines = [f"MISMATCH ({result.compared} tensors in both)"]
    for label, items in (
        ("missing in candidate", result.missing),
        ("only in candidate", result.unexpected),
        ("shape mismatch", result.shape_mismatch),
    ):
        lines += [f"  {label}: {item}" for item in items]
    lines += [f"  values differ: {name} (max |diff| {diff:.3g})" for name, diff in result.value_mismatch]
    return "\n".join(lines)


def is_hf_folder(path: Path) -> bool:
    """A model folder (``config.json``) or an adapter folder (``adapter_config.json``)."""
    return (path / CONFIG_FILE).is_file() or (path / ADAPTER_CONFIG_FILE).is_file()


def folder_state_dict(path: str | os.PathLike, trust_remote_code: bool = False) -> dict[str, torch.Tensor]:
    """The tensors of an HF folder: a full model as loaded, an adapter folder as stored."""
    path = Path(path)
    if not is_hf_folder(path):
        raise CheckpointError(f"{path} is not a Hugging Face folder (no {CONFIG_FILE} or {ADAPTER_CONFIG_FILE})")
    if not (path / CONFIG_FILE).is_file():
        return _adapter_tensors(path)
    try:
        auto_class = causal_lm_auto_class(is_vision_language_folder(path))
        model = auto_class.from_pretrained(
            path, dtype="auto", local_files_only=True, trust_remote_code=trust_remote_code
        )
    except WEIGHT_LOAD_ERRORS as err:
        raise CheckpointError(str(weights_load_error(path, err, "the model"))) from err
    return model.state_dict()


def _adapter_tensors(path: Path) -> dict[str, torch.Tensor]:
    for name in ADAPTER_WEIGHT_FILES:
        file = path / name
        if not file.is_file():
            continue
        try:
            if name.endswith(".safetensors"):
                return load_file(str(file))
            return torch.load(file, map_location="cpu", weights_only=True)
        except pickle.UnpicklingError as err:
            raise CheckpointError(f"{file}: {pickle_refusal(err)}") from err
        except (SafetensorError, OSError, RuntimeError) as err:
            raise CheckpointError(f"{file}: unreadable adapter weights: {err}") from err
    raise CheckpointError(f"{path}: adapter folder without {' or '.join(ADAPTER_WEIGHT_FILES)}")


def candidate_state_dict(
    local_dir: str | os.PathLike, hf_model_config_path: str | None = None, backend: str = "auto"
) -> dict[str, torch.Tensor]:
    """An HF folder's tensors, or a checkpoint's merged model tensors (built in memory)."""
    path = Path(local_dir)
    if is_hf_folder(path):
        return folder_state_dict(path)
    return merged_model(build_model(locate_checkpoint(path, hf_model_config_path, backend))).state_dict()
