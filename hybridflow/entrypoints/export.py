"""``hybridflow export``: checkpoint → Hugging Face folder, and a check against a reference folder.

    hybridflow export merge --local_dir ckpts/global_step_20/actor --target_dir out/hf
    hybridflow export merge --local_dir ckpts --target_dir out/adapter --lora adapter
    hybridflow export test  --local_dir out/hf --test_hf_dir reference/hf

``test`` compares tensor by tensor: the same names, the same shapes, values within
``|a - b| ≤ atol + rtol·|b|`` (computed in fp32). ``--local_dir`` may be an exported folder or
a checkpoint (merged in memory first). Full models are compared through
``AutoModelForCausalLM.from_pretrained`` (``AutoModelForImageTextToText`` for a vision-language
folder, so sharding, ``.bin`` vs safetensors and tied weights
do not matter); adapter folders by their ``adapter_model`` tensors. Exit status: 0 equal,
1 different, 2 bad input.
"""

from __future__ import annotations

import argparse
import logging
import sys

from hybridflow.export.compare import (
    candidate_state_dict,
    compare_state_dicts,
    folder_state_dict,
    format_comparison,
)
from hybridflow.export.reader import CHECKPOINT_READERS, CheckpointError
from hybridflow.export.writer import EXPORT_DTYPES, LORA_MODES, merge_checkpoint

# --- command line --------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hybridflow export", description="Export checkpoints to Hugging Face folders."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    merge = sub.add_parser("merge", help="write a checkpoint as a Hugging Face folder")
    test = sub.add_parser("test", help="compare a checkpoint or exported folder with a reference HF folder")
    for p in (merge, test):
        p.add_argument(
            "--local_dir",
            "--local-dir",
            required=True,
            help="checkpoint: run folder, global_step_N/ or global_step_N/actor/ (test: also an HF folder)",
        )
        p.add_argument(
            "--backend",
            default="auto",
            help=f"checkpoint reader: auto or one of {', '.join(CHECKPOINT_READERS.names())}",
        )
        p.add_argument(
            "--hf_model_config_path",
            "--hf-model-config-path",
            default=None,
            help="base model folder: config/tokenizer for checkpoints saved without hf_config/ or tokenizer/",
        )
    merge.add_argument(
        "--target_dir",
        "--target-dir",
        required=True,
        help="output folder: new, empty, or an earlier export's (its files are replaced)",
    )
    merge.add_argument(
        "--overwrite",
        action="store_true",
        help="also write into a non-empty folder that no export made: files of the same names are "
        "replaced, nothing else is removed",
    )
    merge.add_argument(
        "--lora", choices=LORA_MODES, default="merge", help="LoRA checkpoints: merged weights or the adapter alone"
    )
    merge.add_argument(
        "--base_model_name_or_path",
        "--base-model-name-or-path",
        default=None,
        help="--lora adapter: the base model the adapter config names (default: the training model path)",
    )
    merge.add_argument(
        "--dtype", choices=("auto", *EXPORT_DTYPES), default="auto", help="weights dtype (auto: as stored)"
    )
    test.add_argument("--test_hf_dir", "--test-hf-dir", required=True, help="reference Hugging Face folder")
    test.add_argument("--atol", type=float, default=1e-6, help="absolute tolerance")
    test.add_argument("--rtol", type=float, default=1e-5, help="relative tolerance")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    try:
        if args.command == "merge":
            out = merge_checkpoint(
                args.local_dir,
                args.target_dir,
                hf_model_config_path=args.hf_model_config_path,
                backend=args.backend,
                lora=args.lora,
                dtype=args.dtype,
                base_model_name_or_path=args.base_model_name_or_path,
                overwrite=args.overwrite,
            )
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
