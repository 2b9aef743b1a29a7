"""``hybridflow export``: checkpoint → Hugging Face folder, and a check against a reference folder.

    hybridflow export merge --local_dir ckpts/global_step_20/actor --target_dir out/hf
    hybridflow export merge --local_dir ckpts --target_dir out/adapter --lora adapter
    hybridflow export test  --local_dir out/hf --test_hf_dir reference/hf

``test`` compares tensor by tensor: the same names, the same shapes, values within
``|a - b| ≤ atol + rtol·|b|`` (computed in fp32). ``--local_dir`` may be an exported folder or
a checkpoint (merged in memory first). Full models are compared through
``AutoModelForCausalLM.from_pretrained`` (so sharding, ``.bin`` vs safetensors and tied weights
do not matter); adapter folders by their ``adapter_model`` tensors. Exit status: 0 equal,
1 different, 2 bad input.
"""

from __future__ import annotations

import argparse
import logging
import os
import pickle
import sys
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from hybridflow.engine.checkpoint import pickle_refusal
from hybridflow.models.hf_metadata import ADAPTER_CONFIG_FILE, CONFIG_FILE
from hybridflow.models.loader import WEIGHT_LOAD_ERRORS, weights_load_error
from hybridflow.trainer.model_merger import (
    CHECKPOINT_READERS,
    EXPORT_DTYPES,
    LORA_MODES,
    CheckpointError,
    build_model,
    locate_checkpoint,
    merge_checkpoint,
    merged_model,
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
    for label, items in (("missing in candidate", result.missing), ("only in candidate", result.unexpected),
                         ("shape mismatch", result.shape_mismatch)):
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
        model = AutoModelForCausalLM.from_pretrained(
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


# --- command line --------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hybridflow export", description="Export checkpoints to Hugging Face folders.")
    sub = parser.add_subparsers(dest="command", required=True)
    merge = sub.add_parser("merge", help="write a checkpoint as a Hugging Face folder")
    test = sub.add_parser("test", help="compare a checkpoint or exported folder with a reference HF folder")
    for p in (merge, test):
        p.add_argument("--local_dir", "--local-dir", required=True,
                       help="checkpoint: run folder, global_step_N/ or global_step_N/actor/ (test: also an HF folder)")
        p.add_argument("--backend", default="auto",
                       help=f"checkpoint reader: auto or one of {', '.join(CHECKPOINT_READERS.names())}")
        p.add_argument("--hf_model_config_path", "--hf-model-config-path", default=None,
                       help="base model folder: config/tokenizer for checkpoints saved without hf_config/ or tokenizer/")
    merge.add_argument("--target_dir", "--target-dir", required=True,
                       help="output folder: new, empty, or an earlier export's (its files are replaced)")
    merge.add_argument("--overwrite", action="store_true",
                       help="also write into a non-empty folder that no export made: files of the same names are "
                            "replaced, nothing else is removed")
    merge.add_argument("--lora", choices=LORA_MODES, default="merge",
                       help="LoRA checkpoints: merged weights or the adapter alone")
    merge.add_argument("--base_model_name_or_path", "--base-model-name-or-path", default=None,
                       help="--lora adapter: the base model the adapter config names (default: the training model path)")
    merge.add_argument("--dtype", choices=("auto", *EXPORT_DTYPES), default="auto", help="weights dtype (auto: as stored)")
    test.add_argument("--test_hf_dir", "--test-hf-dir", required=True, help="reference Hugging Face folder")
    test.add_argument("--atol", type=float, default=1e-6, help="absolute tolerance")
    test.add_argument("--rtol", type=float, default=1e-5, help="relative tolerance")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    try:
        if args.command == "merge":
            out = merge_checkpoint(args.local_dir, args.target_dir, hf_model_config_path=args.hf_model_config_path,
                                   backend=args.backend, lora=args.lora, dtype=args.dtype,
                                   base_model_name_or_path=args.base_model_name_or_path, overwrite=args.overwrite)
            print(f"wrote {out}")
            return 0
        candidate = candidate_state_dict(args.local_dir, args.hf_model_config_path, args.backend)
        reference = folder_state_dict(args.test_hf_dir)
    except (CheckpointError, ValueError) as err:
        print(f"hybridflow export: {err}", file=sys.stderr)
        return 2
    result = compare_state_dicts(candidate, reference, atol=args.atol, rtol=args.rtol)
    print(format_comparison(result))
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
