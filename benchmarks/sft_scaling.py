"""SFT training speed (tokens/s) on this machine's cores: one process vs data-parallel ranks,
padded vs packed rows.

Usage:
    python benchmarks/sft_scaling.py                                  # smollm2-135m-instruct
    python benchmarks/sft_scaling.py --model tiny-llama --steps 3     # smoke mode, seconds
    python benchmarks/sft_scaling.py --out sft_scaling.json
    python benchmarks/sft_scaling.py --layouts padded                 # no packed variants
    python benchmarks/sft_scaling.py --launches dp1-plain,dp2-torchrun

The same job — the built-in ``arithmetic-sft`` task written here into a temp folder, the same
global batch, micro-batch size, number of steps, fp32 — runs as:

* ``dp1-plain``: ``hybridflow sft`` in one plain process (the torch engine), ``--threads`` torch
  threads (default: every core);
* ``dp1-torchrun``: the same under ``torchrun --nproc_per_node=1`` (the FSDP2 engine on one
  rank, gloo), same thread count — what the launcher and the FSDP engine cost by themselves;
* ``dp2-torchrun``: ``torchrun --nproc_per_node=2``, one thread per rank
  (``OMP_NUM_THREADS=1``): the same cores split into two data-parallel ranks.

and each of them again with packed rows (``model.use_remove_padding=true``: every
micro-batch's examples back to back in one row, attention per example, no padding computed) —
``--layouts`` picks padded, packed or both, ``--launches`` which of the three.

Each variant is its own subprocess. Only optimizer steps are timed: the trainer's own
``timing_s/step`` (rank 0's wall time of forward, backward, all-reduces and the optimizer
step) and ``perf/total_num_tokens`` (real tokens, summed over ranks) from the run's
``metrics.jsonl``; the first ``--warmup`` steps are left out. Start-up, data loading and the
final checkpoint are not counted (the wall time column shows them). The load average when each
variant starts is recorded too: on a shared machine other jobs' load changes the rates.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (  # noqa: E402
    HYBRIDFLOW,
    REPO_ROOT,
    child_env,
    cpu_kind,
    describe_machine,
    hardware_facts,
    machine_facts,
    run_logged,
    write_json,
)

TORCHRUN_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
SFT_MODULE = "hybridflow.entrypoints.sft"
LAYOUTS = ("padded", "packed")
LAUNCHES = ("dp1-plain", "dp1-torchrun", "dp2-torchrun")


@dataclass(frozen=True)
class Variant:
    """One way to run the job: how it is launched, on how many ranks, with how many threads each."""

    name: str
    torchrun: bool
    ranks: int
    threads: int
    packed: bool = False

    @property
    def label(self) -> str:
        return f"{self.name}-packed" if self.packed else self.name


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m-instruct", help="model name or HF folder")
    parser.add_argument("--steps", type=int, default=4, help="timed optimizer steps per variant")
    parser.add_argument("--warmup", type=int, default=1, help="untimed first steps per variant")
    parser.add_argument("--batch", type=int, default=8, help="global batch (examples per optimizer step)")
    parser.add_argument("--micro-batch", type=int, default=4, help="examples per forward/backward pass, per rank")
    parser.add_argument("--max-length", type=int, default=256, help="data.max_length (tokens per example)")
    parser.add_argument("--digits", type=int, default=3, help="operand digits of the arithmetic problems")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="torch threads of the DP=1 runs")
    parser.add_argument("--work", type=Path, default=None, help="folder for data, runs and logs (default: a temp one)")
    parser.add_argument("--timeout", type=float, default=900, help="seconds allowed per variant")
    parser.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    parser.add_argument(
        "--layouts", default=",".join(LAYOUTS), help="micro-batch layouts to measure: padded, packed or both"
    )
    parser.add_argument(
        "--launches", default=",".join(LAUNCHES), help=f"launches to measure: a subset of {', '.join(LAUNCHES)}"
    )
    args = parser.parse_args(argv)
    for name, allowed in (("layouts", LAYOUTS), ("launches", LAUNCHES)):
        chosen = tuple(dict.fromkeys(item.strip() for item in getattr(args, name).split(",") if item.strip()))
        if not chosen or not set(chosen) <= set(allowed):
            parser.error(f"--{name} takes a comma-separated subset of {', '.join(allowed)}, got {chosen}")
        setattr(args, name, chosen)
    if args.steps < 1 or args.warmup < 0:
        parser.error(f"--steps must be ≥ 1 and --warmup ≥ 0, got {args.steps} and {args.warmup}")
    if args.batch % 2 or (args.batch // 2) % args.micro_batch:
        parser.error(f"--batch {args.batch} must split over 2 ranks into micro-batches of {args.micro_batch}")
    return args


def sft_overrides(args: argparse.Namespace, data: Path, run_dir: Path) -> list[str]:
    """The job every variant runs: no validation, no HF export (the last checkpoint is still written)."""
    return [
        f"model.path={args.model}",
        "model.dtype=fp32",
        f"data.train_files=[{data / 'train.parquet'}]",
        "data.val_files=[]",
        f"data.max_length={args.max_length}",
        f"data.train_batch_size={args.batch}",
        f"data.micro_batch_size_per_gpu={args.micro_batch}",
        "optim.lr=1e-5",
        f"trainer.total_training_steps={args.warmup + args.steps}",
        "trainer.device=cpu",
        "trainer.export_hf=false",
        "trainer.resume_mode=disable",
        f"trainer.default_local_dir={run_dir}",
        "trainer.logger=[jsonl]",
    ]


def variant_command(variant: Variant, overrides: list[str]) -> list[str]:
    """The command line of one variant (the interpreter running this script, never a PATH name)."""
    extra = ["model.use_remove_padding=true"] if variant.packed else []
    if not variant.torchrun:
        return [sys.executable, "-m", SFT_MODULE, *overrides, *extra]
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={variant.ranks}",
        "-m",
        SFT_MODULE,
        *overrides,
        *extra,
    ]


def timed_steps(run_dir: Path, warmup: int) -> list[dict[str, float]]:
    """The training rows of the run's metrics.jsonl after the first ``warmup`` steps."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    steps = [r for r in rows if "timing_s/step" in r]
    return [r for r in steps if r["step"] > warmup]


def run_variant(variant: Variant, args: argparse.Namespace, data: Path, work: Path) -> dict[str, Any]:
    """Run one variant in its own process (tree); its timed steps summarised."""
    run_dir = work / "runs" / variant.label
    env = {k: v for k, v in child_env(variant.threads).items() if k not in TORCHRUN_VARS}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    cmd = variant_command(variant, sft_overrides(args, data, run_dir))
    load = os.getloadavg()[0]
    wall = run_logged(cmd, work / f"{variant.label}.log", env)
    steps = timed_steps(run_dir, args.warmup)
    if len(steps) != args.steps:
        raise RuntimeError(f"{variant.label}: expected {args.steps} timed steps in {run_dir}, found {len(steps)}")
    seconds = [r["timing_s/step"] for r in steps]
    tokens = sum(r["perf/total_num_tokens"] for r in steps)
    return {
        **asdict(variant),
        "label": variant.label,
        "timed_steps": len(steps),
        "tokens": tokens,
        "seconds": sum(seconds),
        "median_step_s": statistics.median(seconds),
        "tokens_per_s": tokens / sum(seconds),
        "wall_s": wall,
        "load_at_start": load,
        "step_seconds": seconds,
        "losses": [r["train/loss"] for r in steps],
    }


def max_relative(actual: list[float], expected: list[float]) -> float:
    """Largest relative difference of per-step losses: every variant trains the same job, so this
    stays at float-rounding size (a larger one means the variants did not do the same work)."""
    return max(abs(a - b) / max(abs(b), 1e-12) for a, b in zip(actual, expected, strict=True))


def format_table(results: list[dict[str, Any]]) -> list[str]:
    """The Markdown table: one row per variant, speed relative to the first (DP=1, one plain
    process) and, for a packed variant, to the same launch padded."""
    base, losses = results[0]["tokens_per_s"], results[0]["losses"]
    padded = {r["name"]: r["tokens_per_s"] for r in results if not r["packed"]}
    lines = [
        "| variant | launcher | ranks × threads | rows | timed steps | median step (s) | tokens/s | "
        f"vs {results[0]['label']} | packed vs padded | loss vs {results[0]['label']} | load at start | wall (s) |",
        "|---|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        launcher = "torchrun" if r["torchrun"] else "plain"
        vs_padded = f"{r['tokens_per_s'] / padded[r['name']]:.2f}×" if r["packed"] and r["name"] in padded else "—"
        lines.append(
            f"| {r['label']} | {launcher} | {r['ranks']} × {r['threads']} | {'packed' if r['packed'] else 'padded'} | "
            f"{r['timed_steps']} | {r['median_step_s']:.2f} | {r['tokens_per_s']:.1f} | "
            f"{r['tokens_per_s'] / base:.2f}× | {vs_padded} | {max_relative(r['losses'], losses):.1e} | "
            f"{r['load_at_start']:.1f} | {r['wall_s']:.0f} |"
        )
    return lines


def variants(threads: int, layouts: tuple[str, ...], names: tuple[str, ...] = LAUNCHES) -> list[Variant]:
    """The launches ``names`` in each of ``layouts`` (padded first, launches in LAUNCHES order)."""
    every = [
        Variant("dp1-plain", False, 1, threads),
        Variant("dp1-torchrun", True, 1, threads),
        Variant("dp2-torchrun", True, 2, 1),
    ]
    launches = [v for v in every if v.name in names]
    return [
        Variant(v.name, v.torchrun, v.ranks, v.threads, layout == "packed")
        for layout in LAYOUTS
        if layout in layouts
        for v in launches
    ]


def run(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """Write the data, run every variant; the report as a dict (also printed)."""
    env = child_env(args.threads)
    data = work / "data"
    train_size = args.batch * (args.warmup + args.steps)
    run_logged(
        [
            *HYBRIDFLOW,
            "data",
            "arithmetic-sft",
            "--out",
            str(data),
            "--train-size",
            str(train_size),
            "--test-size",
            "4",
            "--digits",
            str(args.digits),
            "--seed",
            "0",
        ],
        work / "data.log",
        env,
    )
    machine, hardware = machine_facts(), hardware_facts("fp32", args.max_length, args.threads)
    results = [run_variant(v, args, data, work) for v in variants(args.threads, args.layouts, args.launches)]
    header = describe_machine(machine, hardware, args.threads)
    lines = [
        f"## SFT speed, {args.model}, fp32, {cpu_kind(machine, hardware)}",
        "",
        *header,
        "",
        f"global batch {args.batch}, micro-batch {args.micro_batch} per rank, max_length {args.max_length}, "
        f"{args.warmup} warm-up + {args.steps} timed steps per variant",
        "",
        *format_table(results),
        "",
    ]
    print("\n".join(lines), flush=True)
    return {
        "model": args.model,
        "settings": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "machine": machine,
        "hardware": hardware,
        "results": results,
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.work is not None:
        args.work.mkdir(parents=True, exist_ok=True)
        report = run(args, args.work)
    else:
        with tempfile.TemporaryDirectory(prefix="sft_scaling_") as tmp:
            report = run(args, Path(tmp))
    if args.out is not None:
        print(f"wrote {write_json(args.out, report)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
