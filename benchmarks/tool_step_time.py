"""Tool-task GRPO step time of two source trees (before / after a change), same job on both.

    git worktree add /tmp/before <commit>
    python benchmarks/tool_step_time.py --tree before=/tmp/before --tree after=.   # ~15 min on 2 cores

The job is ``benchmarks/agent_tool_lookup.py``'s: ``hybridflow data tool-lookup``, a short SFT
warm start so the model calls ``lookup`` (made once, with this checkout), then ``hybridflow
train`` through ``tool_agent`` with tools on, ``--steps`` steps of ``--prompts-per-step`` ×
``--n`` samples, no validation and no checkpoints. Each tree runs it in its own process
(``PYTHONPATH`` = the tree), the trees alternating ``--repeats`` times so drift on a shared
machine falls on both. Per tree: the median over runs and steps (step 1, the warm-up, left out)
of the step time, its generation phase (``timing_s/gen``) and the update, and the mean response
length, tool calls per trajectory and reward of those steps.

The work is alike, not identical: the trajectories come back from their tool calls at moments
that depend on timing, so which requests share a forward differs from run to run, rounding
differs with it, and sampled tokens drift apart after a few steps even on one tree. Compare the
response lengths before reading a ratio of times; ``--repeats`` averages the drift.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the benchmarks' shared helpers
from agent_tool_lookup import DEFAULT_MODEL, sft_checkpoint  # noqa: E402
from common import (  # noqa: E402
    HYBRIDFLOW,
    child_env,
    cpu_kind,
    describe_machine,
    hardware_facts,
    machine_facts,
    run_logged,
    write_json,
)

TIMES = ("timing_s/step", "timing_s/gen", "timing_s/update_actor")
WORK = ("response_length/mean", "tool_call_counts/mean", "critic/score/mean")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--tree",
        action="append",
        required=True,
        metavar="NAME=PATH",
        help="a source tree to time (give two or more; the first is the baseline of the ratios)",
    )
    parser.add_argument("--model", default=DEFAULT_MODEL, help=f"model name or HF folder (default {DEFAULT_MODEL})")
    parser.add_argument("--work-dir", default=None, help="data, checkpoints and logs (default: a new temp folder)")
    parser.add_argument("--steps", type=int, default=4, help="GRPO steps per run (default 4; step 1 is left out)")
    parser.add_argument("--repeats", type=int, default=2, help="runs per tree, alternating (default 2)")
    parser.add_argument("--prompts-per-step", type=int, default=8, help="prompts per step (default 8)")
    parser.add_argument("--n", type=int, default=4, help="samples per prompt (default 4)")
    parser.add_argument(
        "--sft-size", type=int, default=64, help="worked tool conversations for the warm start (default 64)"
    )
    parser.add_argument("--prompt-length", type=int, default=320, help="data.max_prompt_length (default 320)")
    parser.add_argument("--response-length", type=int, default=96, help="data.max_response_length (default 96)")
    parser.add_argument("--sft-max-length", type=int, default=384, help="SFT data.max_length (default 384)")
    parser.add_argument("--seed", type=int, default=1, help="trainer seed (default 1)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: all cores)")
    parser.add_argument("--out", default=None, help="JSON result (default <work-dir>/tool_step_time.json)")
    return parser


def parse_trees(specs: list[str]) -> dict[str, Path]:
    trees = {}
    for spec in specs:
        name, sep, path = spec.partition("=")
        if not sep or not name or not (Path(path) / "hybridflow" / "__init__.py").is_file():
            raise SystemExit(f"--tree {spec!r}: expected NAME=PATH with PATH a checkout holding hybridflow/")
        trees[name] = Path(path).resolve()
    if len(trees) < 2:
        raise SystemExit("--tree: give at least two trees to compare")
    return trees


def tree_env(env: dict[str, str], tree: Path) -> dict[str, str]:
    """``env`` with ``tree`` first on the import path; checks that a child started in ``tree``
    (``python -m`` puts the working folder first) imports hybridflow from it."""
    env = {**env, "PYTHONPATH": str(tree)}
    probe = [sys.executable, "-c", "import hybridflow; print(hybridflow.__file__)"]
    found = Path(subprocess.run(probe, env=env, cwd=tree, capture_output=True, text=True, check=True).stdout.strip())
    if not found.resolve().is_relative_to(tree):
        raise SystemExit(f"--tree {tree}: a child imports hybridflow from {found}, not from the tree")
    return env


def step_rows(run_dir: Path) -> list[dict[str, Any]]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [row for row in map(json.loads, filter(str.strip, lines)) if "timing_s/step" in row]


def summarize(runs: list[list[dict[str, Any]]]) -> dict[str, Any]:
    """Medians of the times and means of the work over every run's steps after the first."""
    later = [row for rows in runs for row in rows[1:]]
    return {
        "median_s": {
            key: statistics.median(row[key] for row in later) for key in TIMES if all(key in r for r in later)
        },
        "mean_work": {key: statistics.fmean(row[key] for row in later) for key in WORK if all(key in r for r in later)},
    }


def prepare(args: argparse.Namespace, work: Path, data: Path, env: dict[str, str]) -> None:
    """The task's data and the SFT warm start (made once per work folder)."""
    run_logged(
        [
            *HYBRIDFLOW,
            "data",
            "tool-lookup",
            "--out",
            str(data),
            "--train-size",
            str(args.prompts_per_step * args.steps),
            "--test-size",
            "8",
            "--sft-size",
            str(args.sft_size),
        ],
        work / "data.log",
        env,
    )
    run_logged(
        [
            *HYBRIDFLOW,
            "sft",
            f"model.path={args.model}",
            f"data.train_files=[{data / 'sft.parquet'}]",
            "data.val_files=[]",
            "data.multiturn.enable=true",
            f"data.max_length={args.sft_max_length}",
            "data.train_batch_size=8",
            "data.micro_batch_size_per_gpu=8",
            "optim.lr=3e-5",
            f"trainer.seed={args.seed}",
            f"trainer.default_local_dir={work / 'sft'}",
        ],
        work / "sft.log",
        env,
    )


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    trees = parse_trees(args.tree)
    if args.steps < 2:
        raise SystemExit("--steps: at least 2 (step 1, the warm-up, is left out of the times)")
    work = Path(args.work_dir) if args.work_dir else Path(__import__("tempfile").mkdtemp(prefix="tool_step_"))
    work.mkdir(parents=True, exist_ok=True)
    threads = args.threads or os.cpu_count() or 1
    machine, hardware = machine_facts(), hardware_facts("auto", 512, threads)
    print("\n".join(describe_machine(machine, hardware, threads)), flush=True)
    env = child_env(threads)
    data = work / "data"
    if (work / "sft" / "latest_checkpointed_iteration.txt").is_file():
        print(f"reusing the data and SFT checkpoint in {work}", flush=True)
    else:
        prepare(args, work, data, env)
    job = [
        f"actor_rollout_ref.model.path={sft_checkpoint(work / 'sft')}",
        "algorithm.adv_estimator=grpo",
        f"data.train_files=[{data / 'train.parquet'}]",
        f"data.val_files=[{data / 'test.parquet'}]",
        f"data.train_batch_size={args.prompts_per_step}",
        f"actor_rollout_ref.rollout.n={args.n}",
        f"data.max_prompt_length={args.prompt_length}",
        f"data.max_response_length={args.response_length}",
        "actor_rollout_ref.rollout.multi_turn.enable=true",
        "actor_rollout_ref.rollout.agent.default_agent_loop=tool_agent",
        f"actor_rollout_ref.rollout.multi_turn.tool_config_path={data / 'tools.yaml'}",
        "actor_rollout_ref.rollout.multi_turn.max_assistant_turns=3",
        f"trainer.seed={args.seed}",
        "trainer.val_before_train=false",
        "trainer.test_freq=-1",
        "trainer.save_freq=-1",
        f"trainer.total_training_steps={args.steps}",
        "trainer.logger=[console,jsonl]",
    ]
    runs: dict[str, list[list[dict[str, Any]]]] = {name: [] for name in trees}
    for repeat in range(args.repeats):
        for name, tree in trees.items():
            run_dir = work / f"{name}_{repeat}"
            run_logged(
                [*HYBRIDFLOW, "train", *job, f"trainer.default_local_dir={run_dir}"],
                work / f"{name}_{repeat}.log",
                tree_env(env, tree),
                cwd=tree,
            )
            runs[name].append(step_rows(run_dir))
    results = {name: summarize(r) for name, r in runs.items()}
    base = next(iter(trees))
    print(
        f"\ntool-task GRPO step ({cpu_kind(machine, hardware)}, {threads} threads; median of steps 2..{args.steps} "
        f"over {args.repeats} runs per tree; load average now {os.getloadavg()[0]:.1f})"
    )
    for name, result in results.items():
        times = result["median_s"]
        ratios = {k: results[base]["median_s"][k] / v for k, v in times.items() if k in results[base]["median_s"]}
        print(
            f"  {name:>8}: "
            + ", ".join(
                f"{k.removeprefix('timing_s/')} {v:.2f} s ({base}/{name} {ratios[k]:.2f}×)" for k, v in times.items()
            )
        )
        done = result["mean_work"]
        print(
            f"  {'':>8}  response {done.get('response_length/mean', float('nan')):.1f} tokens, "
            f"tool calls {done.get('tool_call_counts/mean', float('nan')):.2f} per trajectory, "
            f"reward {done.get('critic/score/mean', float('nan')):.3f}"
        )
    out = Path(args.out) if args.out else work / "tool_step_time.json"
    write_json(
        out,
        {
            "settings": vars(args),
            "trees": {k: str(v) for k, v in trees.items()},
            "machine": machine,
            "hardware": hardware,
            "runs": runs,
            "results": results,
        },
    )
    print(f"result: {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
