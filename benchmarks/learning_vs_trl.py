"""Learning speed: held-out greedy accuracy against training wall time, hybridflow vs TRL GRPO, over seeds.

    pip install -e ".[bench]"  "torch==2.13.0"                 # trl==1.16.0
    python benchmarks/learning_vs_trl.py                        # SmolLM2-135M-Instruct, arithmetic, 20 min per side
    python benchmarks/learning_vs_trl.py --task countdown --seeds 1,2,3 --budget-min 5 --eval-every-min 5
    python benchmarks/learning_vs_trl.py --fast --budget-min 0.5 --eval-every-min 0.25   # tiny model

Not a test, and long: each side trains for ``--budget-min`` minutes of *training* time (the
sum of its step times; model loading and evaluation are not counted), one side after the
other, on the job of ``grpo_vs_trl.py`` (same prompts in the same order, same reward, same
settings) except for a learning rate large enough to move a 135M model in minutes, on a
built-in task (``--task``: arithmetic or countdown). Every ``--eval-every-min`` minutes of
training time, and at 0 and at the end, each side measures the share of the same held-out
prompts its greedy completions (≤ ``--max-new-tokens`` tokens) solve — the scorer's ``acc``
(countdown's score gives 0.1 to a wrong but well-formed equation; ``acc`` does not) —
hybridflow with ``PPOTrainer.validate`` (its sampler, ``val_kwargs``), TRL with
``model.generate``. At 0 both models are identical, so the two first points double as a
check that the two evaluators agree; the seeds after the first skip that evaluation (greedy
decoding of the same model: the same result) and reuse the first seed's.

``--seeds 1,2,3`` repeats both sides per seed (seed order: hybridflow, TRL, next seed) and
reports, per side and evaluation point, the mean, the spread (min–max, standard deviation)
and one binomial standard error of a single run's accuracy on ``--test-size`` prompts.

Writes the JSON result (``--out``) and a PNG of accuracy against training minutes (``--png``).
"""

from __future__ import annotations

import argparse
import math
import os
import shlex
import statistics
import sys
import tempfile
import textwrap
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
    write_task,
    write_json,
)

FAST_MODEL = "tiny-llama"
DEFAULT_MODEL = "smollm2-135m-instruct"
COLORS = {"hybridflow": "tab:blue", "trl": "tab:orange"}


TASKS = ("arithmetic", "countdown")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help=f"model name or HF folder (default {DEFAULT_MODEL})")
    parser.add_argument("--fast", action="store_true", help=f"the tiny random model ({FAST_MODEL})")
    parser.add_argument("--task", choices=TASKS, default="arithmetic", help="built-in task (default arithmetic)")
    parser.add_argument("--task-args", default="", help="extra arguments of `hybridflow data TASK`, one string")
    parser.add_argument("--budget-min", type=float, default=20.0, help="training minutes per side (default 20)")
    parser.add_argument("--eval-every-min", type=float, default=None, help="default: budget / 5")
    parser.add_argument("--train-size", type=int, default=2000, help="training prompts written (default 2000)")
    parser.add_argument("--test-size", type=int, default=400,
                        help="held-out prompts (default 400: one standard error ≤ 2.5 points)")
    parser.add_argument("--digits", type=int, default=2, help="operand digits of the arithmetic task (default 2)")
    parser.add_argument("--prompts", type=int, default=8, help="prompts per step (default 8)")
    parser.add_argument("--samples", type=int, default=4, help="samples per prompt (default 4)")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--lr", type=float, default=1e-5)
    parser.add_argument("--kl-coef", type=float, default=0.001)
    parser.add_argument("--micro-batch", type=int, default=8)
    parser.add_argument("--dtype", choices=("auto", "fp32", "bf16"), default="auto",
                        help="compute dtype of both sides; auto = hybridflow's rule on this CPU (default)")
    parser.add_argument("--seeds", default="1", help="comma-separated training seeds, one run per side each (default 1)")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--sides", default="hybridflow,trl", help="which sides, in running order")
    parser.add_argument("--work-dir", default=None, help="scratch folder (default: a new temporary folder)")
    parser.add_argument("--out", default=None, help="result JSON (default WORK_DIR/learning_vs_trl.json)")
    parser.add_argument("--png", default=None, help="plot (default WORK_DIR/learning_vs_trl.png)")
    return parser


def side_settings(args: argparse.Namespace, model: str, data: Path, run_dir: Path, dtype: str, seed: int,
                  attn_implementation: str = "auto", start_eval: bool = True) -> BenchSettings:
    budget_s = args.budget_min * 60
    every_s = (args.eval_every_min * 60) if args.eval_every_min else budget_s / 5
    return BenchSettings(
        model=model, train_file=str(data / "train.parquet"), test_file=str(data / "test.parquet"),
        run_dir=str(run_dir), prompts_per_step=args.prompts, samples_per_prompt=args.samples,
        max_new_tokens=args.max_new_tokens, lr=args.lr, kl_coef=args.kl_coef, micro_batch=args.micro_batch,
        dtype=dtype, attn_implementation=attn_implementation, seed=seed, threads=args.threads, warmup_steps=0,
        budget_s=budget_s, eval_every_s=every_s, start_eval=start_eval,
    )


def binomial_se(p: float, n: int) -> float:
    """One standard error of an accuracy ``p`` measured on ``n`` independent prompts."""
    return math.sqrt(max(p * (1 - p), 0.0) / n) if n else float("nan")


def side_summary(result: dict[str, Any]) -> dict[str, Any]:
    """One run: steps done in the budget, their median time, and the first / best / last accuracy."""
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


def over_seeds(runs: list[dict[str, Any]], test_size: int) -> list[dict[str, Any]]:
    """Per evaluation point (the i-th of every run): training minutes, mean / min / max / sd of the
    accuracy over the runs, and the binomial standard error of one run at the mean."""
    points = []
    for i in range(min(len(r["evals"]) for r in runs)):
        accs = [r["evals"][i]["accuracy"] for r in runs]
        mean = statistics.fmean(accs)
        points.append({
            "train_min": statistics.fmean(r["evals"][i]["train_s"] for r in runs) / 60,
            "accuracy_mean": mean, "accuracy_min": min(accs), "accuracy_max": max(accs),
            "accuracy_sd": statistics.stdev(accs) if len(accs) > 1 else 0.0,
            "se_one_run": binomial_se(mean, test_size), "accuracies": accs,
        })
    return points


def plot(runs: dict[str, list[dict[str, Any]]], title: str, png: Path) -> Path:
    """Accuracy (y) against training minutes (x): one thin line per run, the mean over seeds bold."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    for side, side_runs in runs.items():
        color = COLORS.get(side)
        for run in side_runs:
            ax.plot([e["train_s"] / 60 for e in run["evals"]], [e["accuracy"] for e in run["evals"]],
                    color=color, alpha=0.35, linewidth=1)
        steps = statistics.fmean(len(r["steps"]) for r in side_runs)
        if len(side_runs) > 1:
            n = min(len(r["evals"]) for r in side_runs)
            xs = [statistics.fmean(r["evals"][i]["train_s"] for r in side_runs) / 60 for i in range(n)]
            ys = [statistics.fmean(r["evals"][i]["accuracy"] for r in side_runs) for i in range(n)]
            ax.plot(xs, ys, marker="o", color=color, linewidth=2.2,
                    label=f"{side}: mean of {len(side_runs)} seeds ({steps:.0f} steps)")
        else:
            ax.lines[-1].set(alpha=1, linewidth=2, marker="o", label=f"{side} ({steps:.0f} steps)")
    ax.set_xlabel("training wall time (minutes; loading and evaluation excluded)")
    ax.set_ylabel("held-out greedy accuracy")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend()
    ax.set_title(textwrap.fill(title, 110), fontsize=8)
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=120)
    plt.close(fig)
    return png


def markdown_rows(summary: dict[str, list[dict[str, Any]]], steps: dict[str, list[int]]) -> str:
    """One table row per side and evaluation point, for docs/benchmarks.md."""
    lines = ["| side | steps in budget (per seed) | minutes | accuracy: mean (min–max, sd) | one run's SE |",
             "|---|---|---|---|---|"]
    for side, points in summary.items():
        for point in points:
            lines.append(f"| {side} | {', '.join(map(str, steps[side]))} | {point['train_min']:.1f} | "
                         f"{point['accuracy_mean']:.3f} ({point['accuracy_min']:.3f}–{point['accuracy_max']:.3f}, "
                         f"{point['accuracy_sd']:.3f}) | {point['se_one_run']:.3f} |")
    return "\n".join(lines)


def write_data(args: argparse.Namespace, out: Path) -> Path:
    extra = shlex.split(args.task_args)
    if args.task == "arithmetic":
        extra = ["--digits", str(args.digits), *extra]
    return write_task(out, args.task, args.train_size, args.test_size, extra_args=extra)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    sides = [s.strip() for s in args.sides.split(",") if s.strip()]
    if not sides or any(s not in SIDES for s in sides):
        raise SystemExit(f"--sides: valid names are {', '.join(SIDES)}")
    try:
        seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    except ValueError:
        raise SystemExit(f"--seeds: comma-separated integers, got {args.seeds!r}") from None
    if not seeds or len(set(seeds)) != len(seeds):
        raise SystemExit(f"--seeds: distinct integers, got {args.seeds!r}")
    from hybridflow.models import resolve_model_path

    work = Path(args.work_dir or tempfile.mkdtemp(prefix="learning_vs_trl-")).resolve()
    model = str(resolve_model_path(args.model or (FAST_MODEL if args.fast else DEFAULT_MODEL)))
    data = write_data(args, work / "data")
    machine = machine_facts()
    hardware = hardware_facts(args.dtype, 64 + args.max_new_tokens, args.threads)
    print("\n".join(describe_machine(machine, hardware, args.threads)), flush=True)
    dtype, attn = hardware["dtype"], hardware["attn_implementation"]
    runs: dict[str, list[dict[str, Any]]] = {side: [] for side in sides}
    for seed in seeds:
        for side in sides:
            first = not runs[side]
            print(f"seed {seed}: running the {side} side for {args.budget_min:g} training minutes ...", flush=True)
            settings = side_settings(args, model, data, work / f"{side}-seed{seed}", dtype, seed,
                                     attn if side == "trl" else "auto", start_eval=first)
            result = run_side(side, settings, timeout_s=None)
            if not first:  # the same model decoded greedily: the first seed's score at 0
                result["evals"].insert(0, {**runs[side][0]["evals"][0], "reused_from_seed": seeds[0]})
            result["seed"] = seed
            runs[side].append(result)
    summary = {side: over_seeds(side_runs, args.test_size) for side, side_runs in runs.items()}
    title = (f"{Path(model).name}, {args.task}, {dtype} on a {cpu_kind(machine, hardware)}, {args.prompts}×{args.samples} "
             f"per step, lr {args.lr:g}, β {args.kl_coef:g}, {args.test_size} test prompts, seeds {args.seeds}")
    png = plot(runs, title, Path(args.png) if args.png else work / "learning_vs_trl.png")
    out = Path(args.out) if args.out else work / "learning_vs_trl.json"
    settings = side_settings(args, model, data, work, dtype, seeds[0])
    write_json(out, {"settings": asdict(settings), "task": args.task, "task_args": args.task_args, "seeds": seeds,
                     "test_size": args.test_size, "machine": machine, "hardware": hardware, "threads": args.threads,
                     "finished": time.strftime("%Y-%m-%d %H:%M:%S"),
                     "runs": {side: [side_summary(r) for r in side_runs] for side, side_runs in runs.items()},
                     "over_seeds": summary, "results": runs})
    print(markdown_rows(summary, {side: [len(r["steps"]) for r in side_runs] for side, side_runs in runs.items()}))
    print(f"plot: {png}\nresult: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
