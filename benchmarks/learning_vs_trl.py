"""Learning speed: held-out greedy accuracy against training wall time, hybridflow vs TRL GRPO.

    pip install -e ".[bench]"  "torch==2.13.0"                 # trl==1.16.0
    python benchmarks/learning_vs_trl.py                        # SmolLM2-135M-Instruct, 20 min per side
    python benchmarks/learning_vs_trl.py --budget-min 5 --eval-every-min 1
    python benchmarks/learning_vs_trl.py --fast --budget-min 0.5 --eval-every-min 0.25   # tiny model

Not a test, and long: each side trains for ``--budget-min`` minutes of *training* time (the
sum of its step times; model loading and evaluation are not counted), one side after the
other, on the job of ``grpo_vs_trl.py`` (same prompts in the same order, same reward, same
settings) except for a learning rate large enough to move a 135M model in minutes. Every
``--eval-every-min`` minutes of training time, and at 0 and at the end, each side scores
greedy completions (≤ ``--max-new-tokens`` tokens) of the same held-out test prompts with the
same scorer: hybridflow with ``PPOTrainer.validate`` (its sampler, ``val_kwargs``), TRL with
``model.generate``. At 0 both models are identical, so the two first points double as a
check that the two evaluators agree.

Writes the JSON result (``--out``) and a PNG of accuracy against training minutes (``--png``).
"""

from __future__ import annotations

import argparse
import os
import statistics
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
    cpu_kind,
    describe_machine,
    hardware_facts,
    machine_facts,
    run_side,
    write_arithmetic_task,
    write_json,
)

FAST_MODEL = "tiny-llama"
DEFAULT_MODEL = "smollm2-135m-instruct"
COLORS = {"hybridflow": "tab:blue", "trl": "tab:orange"}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help=f"model name or HF folder (default {DEFAULT_MODEL})")
    parser.add_argument("--fast", action="store_true", help=f"the tiny random model ({FAST_MODEL})")
    parser.add_argument("--budget-min", type=float, default=20.0, help="training minutes per side (default 20)")
    parser.add_argument("--eval-every-min", type=float, default=None, help="default: budget / 5")
    parser.add_argument("--train-size", type=int, default=2000, help="training prompts written (default 2000)")
    parser.add_argument("--test-size", type=int, default=100, help="held-out prompts (default 100)")
    parser.add_argument("--digits", type=int, default=2, help="operand digits of the arithmetic task (default 2)")
    parser.add_argument("--prompts", type=int, default=8, help="prompts per step (default 8)")
    parser.add_argument("--samples", type=int, default=4, help="samples per prompt (default 4)")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--lr", type=float, default=1e-5)
    parser.add_argument("--kl-coef", type=float, default=0.001)
    parser.add_argument("--micro-batch", type=int, default=8)
    parser.add_argument("--dtype", choices=("auto", "fp32", "bf16"), default="auto",
                        help="compute dtype of both sides; auto = hybridflow's rule on this CPU (default)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--sides", default="hybridflow,trl", help="which sides, in running order")
    parser.add_argument("--work-dir", default=None, help="scratch folder (default: a new temporary folder)")
    parser.add_argument("--out", default=None, help="result JSON (default WORK_DIR/learning_vs_trl.json)")
    parser.add_argument("--png", default=None, help="plot (default WORK_DIR/learning_vs_trl.png)")
    return parser


def side_settings(args: argparse.Namespace, model: str, data: Path, run_dir: Path, dtype: str,
                  attn_implementation: str = "auto") -> BenchSettings:
    budget_s = args.budget_min * 60
    every_s = (args.eval_every_min * 60) if args.eval_every_min else budget_s / 5
    return BenchSettings(
        model=model, train_file=str(data / "train.parquet"), test_file=str(data / "test.parquet"),
        run_dir=str(run_dir), prompts_per_step=args.prompts, samples_per_prompt=args.samples,
        max_new_tokens=args.max_new_tokens, lr=args.lr, kl_coef=args.kl_coef, micro_batch=args.micro_batch,
        dtype=dtype, attn_implementation=attn_implementation, seed=args.seed, threads=args.threads, warmup_steps=0,
        budget_s=budget_s, eval_every_s=every_s,
    )


def side_summary(result: dict[str, Any]) -> dict[str, Any]:
    """Steps done in the budget, their median time, and the first / best / last accuracy."""
    evals = result["evals"]
    return {
        "steps": len(result["steps"]),
        "median_step_s": statistics.median(s["step_s"] for s in result["steps"]) if result["steps"] else float("nan"),
        "accuracy_start": evals[0]["accuracy"],
        "accuracy_end": evals[-1]["accuracy"],
        "accuracy_best": max(e["accuracy"] for e in evals),
        "train_s": evals[-1]["train_s"],
        "eval_s_total": sum(e["eval_s"] for e in evals),
    }


def plot(results: dict[str, dict[str, Any]], title: str, png: Path) -> Path:
    """Accuracy (y) against training minutes (x), one line per side."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    for side, result in results.items():
        xs = [e["train_s"] / 60 for e in result["evals"]]
        ys = [e["accuracy"] for e in result["evals"]]
        ax.plot(xs, ys, marker="o", color=COLORS.get(side), label=f"{side} ({len(result['steps'])} steps)")
    ax.set_xlabel("training wall time (minutes; loading and evaluation excluded)")
    ax.set_ylabel("held-out greedy accuracy")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend()
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=120)
    plt.close(fig)
    return png


def markdown_rows(results: dict[str, dict[str, Any]]) -> str:
    """One table row per side, for docs/benchmarks.md."""
    lines = ["| side | steps in budget | median s/step | accuracy at 0 | best | at the end |", "|---|---|---|---|---|---|"]
    for side, result in results.items():
        s = side_summary(result)
        lines.append(f"| {side} | {s['steps']} | {s['median_step_s']:.1f} | {s['accuracy_start']:.2f} | "
                     f"{s['accuracy_best']:.2f} | {s['accuracy_end']:.2f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    sides = [s.strip() for s in args.sides.split(",") if s.strip()]
    if not sides or any(s not in SIDES for s in sides):
        raise SystemExit(f"--sides: valid names are {', '.join(SIDES)}")
    from hybridflow.models import resolve_model_path

    work = Path(args.work_dir or tempfile.mkdtemp(prefix="learning_vs_trl-")).resolve()
    model = str(resolve_model_path(args.model or (FAST_MODEL if args.fast else DEFAULT_MODEL)))
    data = write_arithmetic_task(work / "data", args.train_size, args.test_size, digits=args.digits)
    machine = machine_facts()
    hardware = hardware_facts(args.dtype, 64 + args.max_new_tokens, args.threads)
    print("\n".join(describe_machine(machine, hardware, args.threads)), flush=True)
    dtype, attn = hardware["dtype"], hardware["attn_implementation"]
    results = {}
    for side in sides:
        print(f"running the {side} side for {args.budget_min:g} training minutes ...", flush=True)
        results[side] = run_side(side, side_settings(args, model, data, work / side, dtype, attn if side == "trl" else "auto"),
                                 timeout_s=None)
    settings = side_settings(args, model, data, work, dtype)
    title = (f"{Path(model).name}, {dtype} on a {cpu_kind(machine, hardware)}, {args.prompts}×{args.samples} per step, lr {args.lr:g}, "
             f"β {args.kl_coef:g}, {args.test_size} test prompts, threads={args.threads}")
    png = plot(results, title, Path(args.png) if args.png else work / "learning_vs_trl.png")
    out = Path(args.out) if args.out else work / "learning_vs_trl.json"
    write_json(out, {"settings": asdict(settings), "machine": machine, "hardware": hardware, "threads": args.threads,
                     "finished": time.strftime("%Y-%m-%d %H:%M:%S"),
                     "summary": {side: side_summary(r) for side, r in results.items()}, **results})
    print(markdown_rows(results))
    print(f"plot: {png}\nresult: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
