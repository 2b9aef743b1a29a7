"""GRPO step speed: hybridflow's trainer vs TRL's ``GRPOTrainer`` on the same job, same run.

    pip install -e ".[bench]"  "torch==2.13.0"       # trl==1.16.0
    python benchmarks/grpo_vs_trl.py                  # SmolLM2-135M-Instruct, fp32, 3 timed steps
    python benchmarks/grpo_vs_trl.py --dtype bf16 --steps 5
    python benchmarks/grpo_vs_trl.py --fast           # tiny random model: checks that both sides run

The job (identical on both sides): the built-in arithmetic task's first prompts in file order,
8 prompts × 4 samples per step, at most 64 new tokens, temperature 1.0, GRPO advantages
normalised by the group std, clipped policy loss (ε = 0.2) with a token-mean over the batch,
k3 KL to a reference model in the loss (hybridflow ``kl_loss_type=low_var_kl``, TRL ``beta``),
one AdamW step per batch (constant lr, weight decay 0, grad-norm clip 1.0), micro-batches
of 8 responses, the same dtype, seed and thread count.

Each side runs in its own process (``_hybridflow_side.py``, ``_trl_side.py``), one after the
other: one warm-up step, then ``--steps`` timed steps. Printed (and written to ``--out``):
median step time, rollout tokens/s (generated tokens / generation time), peak RSS of each
side's process tree (sampled every 0.1 s) and of its main process (``getrusage``), the
ratios TRL / hybridflow, and the work each side does per step — so any difference in what
is computed is stated, not hidden. Timings on a shared machine are noisy: the 1-minute load
average before and after each side is part of the result.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from common import (  # noqa: E402
    SIDES,
    BenchSettings,
    compare,
    format_speed_report,
    machine_facts,
    run_side,
    summarize_steps,
    write_arithmetic_task,
    write_json,
)

FAST_MODEL = "tiny-llama"
DEFAULT_MODEL = "smollm2-135m-instruct"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help=f"model name or HF folder (default {DEFAULT_MODEL})")
    parser.add_argument("--fast", action="store_true", help=f"the tiny random model ({FAST_MODEL}): a quick check")
    parser.add_argument("--steps", type=int, default=3, help="timed steps per side (default 3)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed warm-up steps first (default 1)")
    parser.add_argument("--prompts", type=int, default=8, help="prompts per step (default 8)")
    parser.add_argument("--samples", type=int, default=4, help="samples per prompt (default 4)")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--lr", type=float, default=1e-6)
    parser.add_argument("--kl-coef", type=float, default=0.001, help="KL coefficient β on both sides")
    parser.add_argument("--micro-batch", type=int, default=8, help="responses per forward/backward pass")
    parser.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="torch threads (default: cores)")
    parser.add_argument("--sides", default="hybridflow,trl", help="which sides, in running order")
    parser.add_argument("--work-dir", default=None, help="scratch folder (default: a new temporary folder)")
    parser.add_argument("--out", default=None, help="result JSON (default WORK_DIR/grpo_vs_trl.json)")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds allowed per side")
    return parser


def resolve_model(name: str) -> str:
    """A local HF folder for ``name`` (TRL needs a folder on disk when its KL coefficient is > 0)."""
    from hybridflow.models import resolve_model_path

    return str(resolve_model_path(name))


def settings_for(args: argparse.Namespace, model: str, train_file: Path, run_dir: Path) -> BenchSettings:
    return BenchSettings(
        model=model, train_file=str(train_file), run_dir=str(run_dir), prompts_per_step=args.prompts,
        samples_per_prompt=args.samples, max_new_tokens=args.max_new_tokens, temperature=args.temperature,
        lr=args.lr, kl_coef=args.kl_coef, micro_batch=args.micro_batch, dtype=args.dtype, seed=args.seed,
        threads=args.threads, warmup_steps=args.warmup, steps=args.steps,
    )


def run_comparison(args: argparse.Namespace) -> dict[str, Any]:
    """Both sides on one job; returns the full result (what ``--out`` holds)."""
    sides = [s.strip() for s in args.sides.split(",") if s.strip()]
    unknown = [s for s in sides if s not in SIDES]
    if unknown or not sides:
        raise SystemExit(f"--sides: unknown {unknown}; valid: {', '.join(SIDES)}")
    work = Path(args.work_dir or tempfile.mkdtemp(prefix="grpo_vs_trl-")).resolve()
    model = resolve_model(args.model or (FAST_MODEL if args.fast else DEFAULT_MODEL))
    data = write_arithmetic_task(work / "data", train_size=args.prompts * (args.warmup + args.steps), test_size=8)
    base = settings_for(args, model, data / "train.parquet", work)
    print(f"model {model}; work folder {work}")
    machine = machine_facts()
    results: dict[str, Any] = {}
    for side in sides:
        print(f"running the {side} side ...", flush=True)
        settings = settings_for(args, model, data / "train.parquet", work / side)
        results[side] = run_side(side, settings, timeout_s=args.timeout)
    out: dict[str, Any] = {"settings": asdict(base) | {"run_dir": str(work)}, "machine": machine,
                           "finished": time.strftime("%Y-%m-%d %H:%M:%S"), **results}
    out["summary"] = {side: summarize_steps(result) for side, result in results.items()}
    if {"hybridflow", "trl"} <= results.keys():
        out["ratios"] = compare(results["hybridflow"], results["trl"])
        out["same_first_prompts"] = results["hybridflow"]["first_prompt_ids"] == results["trl"]["first_prompt_ids"]
    return out


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    result = run_comparison(args)
    out = Path(args.out) if args.out else Path(result["settings"]["run_dir"]) / "grpo_vs_trl.json"
    write_json(out, result)
    if "ratios" in result:
        print(format_speed_report(BenchSettings(**{**result["settings"]}), result["hybridflow"], result["trl"]))
        print(f"same prompt tokens on both sides (first step): {result['same_first_prompts']}")
    else:
        for side, summary in result["summary"].items():
            print(side, summary)
    print(f"result: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
