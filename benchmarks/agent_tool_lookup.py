"""Learning to use a tool: SFT warm start, then GRPO through the agent loop, on ``tool-lookup``.

    python benchmarks/agent_tool_lookup.py                     # SmolLM2-135M-Instruct, ~15 min on 2 cores
    python benchmarks/agent_tool_lookup.py --steps 30 --out result.json --png curves.png

Not a test, and long. It runs the user's pipeline with the CLI, one command after the other:

1. ``hybridflow data tool-lookup`` — an RL split whose answers are random codes only the
   ``lookup(key)`` tool knows, a held-out test split, and worked tool conversations for SFT;
2. ``hybridflow sft`` on those conversations (a short warm start: the call format, not mastery);
3. ``hybridflow train`` from the SFT checkpoint with **tools disabled**
   (``multi_turn.enable=false``: the plain rollout) for ``--off-steps`` steps;
4. ``hybridflow train`` from the same checkpoint **with tools**
   (``multi_turn.enable=true``, ``tool_agent``, the task's ``tools.yaml``) for ``--steps`` steps.

Both GRPO runs use the same data, seed and settings; only ``multi_turn.enable`` differs. The
training reward is that of the sampled (temperature 1) responses of each step; validation is
greedy on the test split, before training and at the end.

Pass criteria (the issue's): with tools disabled the reward is ≈ 0 (mean ≤ ``--off-max``); with
tools, the mean reward over the last ``--window-last`` steps is ≥ 0.5 and ≥ 3× the mean over the
first ``--window-first`` steps, and the tool-call validity (``agent_loop/tool_call_validity``:
of the calls attempted, the fraction that parsed and ran without error) is higher over the last
steps than over the first. The script exits 1 when a criterion fails (``--no-check``: never).

Writes the JSON result (``--out``) and a PNG of reward and validity per step (``--png``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the benchmarks' shared helpers
from common import (  # noqa: E402
    HYBRIDFLOW,
    child_env, cpu_kind, describe_machine, hardware_facts, machine_facts, plot_unit_curves, run_logged, write_json,
)

DEFAULT_MODEL = "smollm2-135m-instruct"
SCORE = "critic/score/mean"
VALIDITY = "agent_loop/tool_call_validity"
CALLS = "tool_call_counts/mean"
VAL = "val-core/hybridflow/tool-lookup/reward/mean@1"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=DEFAULT_MODEL, help=f"model name or HF folder (default {DEFAULT_MODEL})")
    parser.add_argument("--work-dir", default=None, help="where data, checkpoints and logs go (default: a new temp folder)")
    parser.add_argument("--steps", type=int, default=16, help="GRPO steps with tools (default 16)")
    parser.add_argument("--off-steps", type=int, default=6, help="GRPO steps with tools disabled (default 6)")
    parser.add_argument("--prompts-per-step", type=int, default=8, help="prompts per step (default 8)")
    parser.add_argument("--n", type=int, default=4, help="samples per prompt (default 4)")
    parser.add_argument("--sft-size", type=int, default=64, help="worked tool conversations (default 64)")
    parser.add_argument("--sft-lr", type=float, default=3e-5, help="SFT learning rate (default 3e-5, one epoch)")
    parser.add_argument("--lr", type=float, default=3e-5, help="GRPO actor learning rate (default 3e-5)")
    parser.add_argument("--prompt-length", type=int, default=320, help="data.max_prompt_length (default 320)")
    parser.add_argument("--response-length", type=int, default=96, help="data.max_response_length (default 96)")
    parser.add_argument("--sft-max-length", type=int, default=384, help="SFT data.max_length (default 384)")
    parser.add_argument("--test-size", type=int, default=64, help="held-out rows (default 64)")
    parser.add_argument("--seed", type=int, default=1, help="trainer seed (default 1)")
    parser.add_argument("--window-first", type=int, default=2, help="steps averaged as 'first' (default 2)")
    parser.add_argument("--window-last", type=int, default=5, help="steps averaged as 'last' (default 5)")
    parser.add_argument("--off-max", type=float, default=0.02, help="largest mean reward counted as ≈ 0 (default 0.02)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: all cores)")
    parser.add_argument("--out", default=None, help="JSON result (default <work-dir>/result.json)")
    parser.add_argument("--png", default=None, help="PNG of the curves (default <work-dir>/curves.png)")
    parser.add_argument("--no-check", action="store_true", help="report only; exit 0 even when a criterion fails")
    return parser


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def train_steps(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One entry per training step: reward, validity, calls per trajectory, step time."""
    steps = []
    for row in rows:
        if SCORE not in row:
            continue  # a validation-only row
        steps.append({"step": row["step"], "reward": row[SCORE], "validity": row.get(VALIDITY),
                      "calls": row.get(CALLS), "step_s": row.get("timing_s/step")})
    return steps


def val_points(rows: list[dict[str, Any]]) -> list[tuple[int, float]]:
    return [(row["step"], row[VAL]) for row in rows if VAL in row]


def mean(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.fmean(present) if present else None


def sft_checkpoint(run_dir: Path) -> Path:
    step = (run_dir / "latest_checkpointed_iteration.txt").read_text().strip()
    return run_dir / f"global_step_{step}" / "hf"


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    work = Path(args.work_dir) if args.work_dir else Path(__import__("tempfile").mkdtemp(prefix="tool_lookup_"))
    work.mkdir(parents=True, exist_ok=True)
    threads = args.threads or os.cpu_count() or 1
    env = child_env(threads)
    machine, hardware = machine_facts(), hardware_facts("auto", 512, threads)
    header = describe_machine(machine, hardware, threads)
    print("\n".join(header), flush=True)
    exe = HYBRIDFLOW
    data = work / "data"
    train_size = args.prompts_per_step * max(args.steps, args.off_steps)
    walls = {}
    walls["data"] = run_logged([*exe, "data", "tool-lookup", "--out", str(data), "--train-size", str(train_size),
                         "--test-size", str(args.test_size), "--sft-size", str(args.sft_size)], work / "data.log", env)
    walls["sft"] = run_logged([
        *exe, "sft", f"model.path={args.model}", f"data.train_files=[{data / 'sft.parquet'}]", "data.val_files=[]",
        "data.multiturn.enable=true", f"data.max_length={args.sft_max_length}", "data.train_batch_size=8", "data.micro_batch_size_per_gpu=8",
        f"optim.lr={args.sft_lr}", f"trainer.seed={args.seed}", f"trainer.default_local_dir={work / 'sft'}",
        "trainer.logger=[console,jsonl]",
    ], work / "sft.log", env)
    start_from = sft_checkpoint(work / "sft")
    common = [
        f"actor_rollout_ref.model.path={start_from}", "algorithm.adv_estimator=grpo",
        f"data.train_files=[{data / 'train.parquet'}]", f"data.val_files=[{data / 'test.parquet'}]",
        f"data.train_batch_size={args.prompts_per_step}", f"actor_rollout_ref.rollout.n={args.n}",
        f"actor_rollout_ref.actor.optim.lr={args.lr}",
        f"data.max_prompt_length={args.prompt_length}", f"data.max_response_length={args.response_length}",
        "actor_rollout_ref.rollout.agent.default_agent_loop=tool_agent",
        f"actor_rollout_ref.rollout.multi_turn.tool_config_path={data / 'tools.yaml'}",
        "actor_rollout_ref.rollout.multi_turn.max_assistant_turns=3",
        f"trainer.seed={args.seed}", "trainer.val_before_train=true", "trainer.logger=[console,jsonl]",
        "trainer.save_freq=-1",
    ]
    runs = {"off": (False, args.off_steps), "on": (True, args.steps)}
    results: dict[str, Any] = {}
    for name, (enable, steps) in runs.items():
        run_dir = work / f"grpo_tools_{name}"
        walls[f"grpo_tools_{name}"] = run_logged([
            *exe, "train", *common, f"actor_rollout_ref.rollout.multi_turn.enable={str(enable).lower()}",
            f"trainer.total_training_steps={steps}", f"trainer.test_freq={steps}",
            f"trainer.default_local_dir={run_dir}",
        ], work / f"grpo_tools_{name}.log", env)
        rows = read_metrics(run_dir)
        results[name] = {"steps": train_steps(rows), "val": val_points(rows)}

    on, off = results["on"]["steps"], results["off"]["steps"]
    first, last = on[: args.window_first], on[-args.window_last :]
    summary = {
        "off_reward_mean": mean([s["reward"] for s in off]),
        "on_first_reward": mean([s["reward"] for s in first]),
        "on_last_reward": mean([s["reward"] for s in last]),
        "on_first_validity": mean([s["validity"] for s in first]),
        "on_last_validity": mean([s["validity"] for s in last]),
        "val_off": results["off"]["val"],
        "val_on": results["on"]["val"],
    }
    checks = {
        "reward ≈ 0 with tools disabled": summary["off_reward_mean"] <= args.off_max,
        "last reward ≥ 0.5 with tools": summary["on_last_reward"] >= 0.5,
        "last reward ≥ 3× first": summary["on_last_reward"] >= 3 * summary["on_first_reward"],
        "tool-call validity rises": (summary["on_last_validity"] or 0) > (summary["on_first_validity"] or 0),
    }
    report = format_report(args, results, summary, checks, walls, header, cpu_kind(machine, hardware))
    print(report)
    out = Path(args.out) if args.out else work / "result.json"
    write_json(out, {"settings": vars(args), "machine": machine, "hardware": hardware, "walls_s": walls,
                     "runs": results, "summary": summary, "checks": checks, "work_dir": str(work)})
    png = Path(args.png) if args.png else work / "curves.png"
    plot(results, png, f"tool-lookup, SmolLM2-135M: SFT warm start → GRPO ({cpu_kind(machine, hardware)})")
    print(f"result: {out}\ncurves: {png}")
    return 0 if args.no_check or all(checks.values()) else 1


def _fmt(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def format_report(args, results, summary, checks, walls, header, kind) -> str:
    lines = ["", f"=== tool-lookup: GRPO with and without tools after an SFT warm start ({kind})", *header, ""]
    lines.append("step | reward (tools) | validity | calls/traj | step s || reward (no tools)")
    off = {s["step"]: s for s in results["off"]["steps"]}
    for s in results["on"]["steps"]:
        o = off.get(s["step"])
        lines.append(f"{s['step']:>4} | {_fmt(s['reward']):>14} | {_fmt(s['validity']):>8} | {_fmt(s['calls'], 2):>10} | "
                     f"{_fmt(s['step_s'], 1):>6} || {_fmt(o['reward']) if o else '':>16}")
    lines += [
        "",
        f"greedy validation (test split) with tools:    {', '.join(f'step {k}: {v:.3f}' for k, v in summary['val_on'])}",
        f"greedy validation (test split) without tools: {', '.join(f'step {k}: {v:.3f}' for k, v in summary['val_off'])}",
        f"reward without tools, mean of {len(results['off']['steps'])} steps: {_fmt(summary['off_reward_mean'])}",
        f"reward with tools: first {args.window_first} steps {_fmt(summary['on_first_reward'])}, "
        f"last {args.window_last} steps {_fmt(summary['on_last_reward'])}",
        f"tool-call validity: first {_fmt(summary['on_first_validity'])}, last {_fmt(summary['on_last_validity'])}",
        "wall time: " + ", ".join(f"{k} {v:.0f} s" for k, v in walls.items()),
        "",
        *[f"[{'PASS' if ok else 'FAIL'}] {name}" for name, ok in checks.items()],
    ]
    return "\n".join(lines)


def plot(results: dict[str, Any], png: Path, title: str) -> None:
    on, off = results["on"]["steps"], results["off"]["steps"]
    steps_on = [s["step"] for s in on]
    validity = [s["validity"] if s["validity"] is not None else float("nan") for s in on]
    plot_unit_curves(png, title, "GRPO step (8 prompts × 4 samples, temperature 1)", [
        (steps_on, [s["reward"] for s in on], dict(marker="o", color="tab:blue", label="reward, with tools")),
        (steps_on, validity, dict(marker=".", linestyle="--", color="tab:green", label="tool-call validity, with tools")),
        ([s["step"] for s in off], [s["reward"] for s in off],
         dict(marker="s", color="tab:red", label="reward, tools disabled")),
    ], legend_loc="center right")


if __name__ == "__main__":
    sys.exit(main())
