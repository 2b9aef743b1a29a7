"""Learning with code rewards: GRPO on ``code-functions`` raises the held-out pass rate.

    python benchmarks/code_learning.py                       # SmolLM2-135M-Instruct, ~15 min on 2 cores
    python benchmarks/code_learning.py --steps 30 --out result.json --png curves.png

Not a test, and long. It runs the user's pipeline with the CLI: ``hybridflow data
code-functions`` (short Python functions with hidden call-based tests), then ``hybridflow
train`` with GRPO, where every response's program runs against its tests in the sandbox
(``hybridflow train`` starts a local ``hybridflow sandbox`` for the scorer processes; see
docs/rewards.md, Code). The held-out score — the mean fraction of test cases passed on the
test split, sampled like training (``--val-n`` samples per problem at ``--val-temperature``;
0 = greedy) — is measured before training and every ``--val-every`` steps.

Pass criterion: the held-out pass rate at the end is higher than before training by at least
``--min-gain``. The script exits 1 otherwise (``--no-check``: never). Writes the JSON result and
a PNG of the training reward and the held-out pass rate per step.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the benchmarks' shared helpers
from common import (  # noqa: E402
    HYBRIDFLOW,
    child_env, cpu_kind, describe_machine, hardware_facts, machine_facts, plot_unit_curves, run_logged, write_json,
)

DEFAULT_MODEL = "smollm2-135m-instruct"
VAL_PREFIX = "val-core/hybridflow/code-functions/reward/mean@"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=DEFAULT_MODEL, help=f"model name or HF folder (default {DEFAULT_MODEL})")
    parser.add_argument("--work-dir", default=None, help="data, run folder and logs (default: a new temp folder)")
    parser.add_argument("--steps", type=int, default=20, help="GRPO steps (default 20)")
    parser.add_argument("--val-every", type=int, default=10, help="validate every N steps (default 10)")
    parser.add_argument("--prompts-per-step", type=int, default=8, help="prompts per step (default 8)")
    parser.add_argument("--n", type=int, default=4, help="samples per prompt (default 4)")
    parser.add_argument("--lr", type=float, default=2e-5, help="actor learning rate (default 2e-5)")
    parser.add_argument("--prompt-length", type=int, default=128, help="data.max_prompt_length (default 128)")
    parser.add_argument("--response-length", type=int, default=128, help="data.max_response_length (default 128)")
    parser.add_argument("--test-size", type=int, default=64, help="held-out problems (default 64)")
    parser.add_argument("--seed", type=int, default=1, help="trainer seed (default 1)")
    parser.add_argument("--val-n", type=int, default=4, help="held-out samples per problem (default 4)")
    parser.add_argument("--val-temperature", type=float, default=1.0,
                        help="held-out sampling temperature (default 1.0, as in training; 0 = greedy, one sample)")
    parser.add_argument("--min-gain", type=float, default=0.02, help="required rise of the held-out score (default 0.02)")
    parser.add_argument("--allow-weak-isolation", action="store_true", help="run without bubblewrap (process limits only)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: all cores)")
    parser.add_argument("--out", default=None, help="JSON result (default <work-dir>/result.json)")
    parser.add_argument("--png", default=None, help="PNG of the curves (default <work-dir>/curves.png)")
    parser.add_argument("--no-check", action="store_true", help="report only; exit 0 even when the criterion fails")
    return parser


def val_overrides(args: argparse.Namespace) -> list[str]:
    """Held-out decoding: sampled like training (the policy's own distribution), or greedy."""
    prefix = "actor_rollout_ref.rollout.val_kwargs"
    if args.val_temperature == 0:
        return [f"{prefix}.do_sample=false", f"{prefix}.n=1"]
    return [f"{prefix}.do_sample=true", f"{prefix}.temperature={args.val_temperature}", f"{prefix}.n={args.val_n}"]


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    work = Path(args.work_dir) if args.work_dir else Path(__import__("tempfile").mkdtemp(prefix="code_learning_"))
    work.mkdir(parents=True, exist_ok=True)
    threads = args.threads or os.cpu_count() or 1
    env = child_env(threads)
    machine, hardware = machine_facts(), hardware_facts("auto", 512, threads)
    header = describe_machine(machine, hardware, threads)
    print("\n".join(header), flush=True)
    exe = HYBRIDFLOW
    data, run_dir = work / "data", work / "grpo"
    walls = {"data": run_logged([*exe, "data", "code-functions", "--out", str(data), "--test-size", str(args.test_size),
                          "--train-size", str(args.prompts_per_step * args.steps)], work / "data.log", env)}
    walls["grpo"] = run_logged([
        *exe, "train", f"actor_rollout_ref.model.path={args.model}", "algorithm.adv_estimator=grpo",
        f"data.train_files=[{data / 'train.parquet'}]", f"data.val_files=[{data / 'test.parquet'}]",
        f"data.train_batch_size={args.prompts_per_step}", f"actor_rollout_ref.rollout.n={args.n}",
        f"actor_rollout_ref.actor.optim.lr={args.lr}", f"data.max_prompt_length={args.prompt_length}",
        f"data.max_response_length={args.response_length}", f"trainer.total_training_steps={args.steps}",
        f"trainer.test_freq={args.val_every}", "trainer.val_before_train=true", f"trainer.seed={args.seed}",
        *val_overrides(args),
        "trainer.logger=[console,jsonl]", "trainer.save_freq=-1", "reward_model.reward_manager=prime",
        "reward_model.timeout_s=60", f"reward_model.code.allow_weak_isolation={str(args.allow_weak_isolation).lower()}",
        f"trainer.default_local_dir={run_dir}",
    ], work / "grpo.log", env)
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    steps = [{"step": r["step"], "reward": r["critic/score/mean"], "step_s": r.get("timing_s/step"),
              "reward_s": r.get("timing_s/reward")} for r in rows if "critic/score/mean" in r]
    n = 1 if args.val_temperature == 0 else args.val_n
    val_key, acc_key = VAL_PREFIX + str(n), f"val-aux/hybridflow/code-functions/acc/mean@{n}"
    val = [(r["step"], r[val_key]) for r in rows if val_key in r]
    val_acc = [(r["step"], r[acc_key]) for r in rows if acc_key in r]  # all tests of a problem passed
    gain = val[-1][1] - val[0][1]
    checks = {f"held-out score rises by ≥ {args.min_gain}": gain >= args.min_gain}
    kind = cpu_kind(machine, hardware)
    lines = ["", f"=== code-functions: GRPO with sandboxed code rewards ({kind})", *header, "",
             "step | train reward | step s | reward phase s"]
    lines += [f"{s['step']:>4} | {s['reward']:>12.3f} | {s['step_s'] or 0:>6.1f} | {s['reward_s'] or 0:>14.2f}" for s in steps]
    how = "greedy" if args.val_temperature == 0 else f"{args.val_n} samples per problem at temperature {args.val_temperature:g}"
    lines += ["", f"held-out score ({how}): " + ", ".join(f"step {k}: {v:.3f}" for k, v in val),
              "held-out, all tests passed: " + ", ".join(f"step {k}: {v:.3f}" for k, v in val_acc),
        f"gain: {gain:+.3f}", "wall time: " + ", ".join(f"{k} {v:.0f} s" for k, v in walls.items()), "",
        *[f"[{'PASS' if ok else 'FAIL'}] {name}" for name, ok in checks.items()]]
    print("\n".join(lines))
    out = Path(args.out) if args.out else work / "result.json"
    write_json(out, {"settings": vars(args), "machine": machine, "hardware": hardware, "walls_s": walls,
                     "steps": steps, "val": val, "val_all_passed": val_acc, "checks": checks, "work_dir": str(work)})
    png = Path(args.png) if args.png else work / "curves.png"
    plot(steps, val, png, f"code-functions, SmolLM2-135M: GRPO with sandboxed tests ({kind})")
    print(f"result: {out}\ncurves: {png}")
    return 0 if args.no_check or all(checks.values()) else 1


def plot(steps: list[dict[str, Any]], val: list[tuple], png: Path, title: str) -> None:
    plot_unit_curves(png, title, "GRPO step", [
        ([s["step"] for s in steps], [s["reward"] for s in steps],
         dict(marker=".", color="tab:blue", label="training reward (sampled, fraction of tests passed)")),
        ([v[0] for v in val], [v[1] for v in val], dict(marker="o", color="tab:green", label="held-out score (sampled)")),
    ], legend_loc="lower right")


if __name__ == "__main__":
    sys.exit(main())
