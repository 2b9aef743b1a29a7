"""A reward model trained here, then GRPO with that model as the only reward.

    python benchmarks/reward_model_pipeline.py                 # SmolLM2-135M-Instruct, ~12 min on 2 cores
    python benchmarks/reward_model_pipeline.py --rm-steps 300 --out result.json --png curves.png

Not a test, and long. It runs the user's pipeline with the CLI:

1. ``hybridflow data arithmetic-pairs``: prompts of the arithmetic task with a correct (chosen)
   and a plausible wrong (rejected) worked answer;
2. ``hybridflow rm``: a Bradley–Terry reward model from SmolLM2 on those pairs (held-out pair
   accuracy before and after);
3. ``hybridflow train`` — the main job's GRPO (2-digit additions, 4 prompts × 4 samples, lr
   1.5e-5) with ``reward_model.enable=true`` and the trained model as the only reward
   (``reward_model.rule_reward=log``: the rule scorer runs beside it and is logged, never
   trained on), validating greedily every ``--val-every`` steps;
4. the same GRPO with the rule scorer as the reward, for comparison (``--no-rule-baseline``: skip).

Reported per validation: held-out accuracy by the rule scorer and the reward model's mean
score on the same greedy responses. **Reward hacking** is reported when the reward model's
score rises while the rule accuracy falls (training or held-out) — a finding, not a failure.

Pass criterion: held-out rule accuracy after GRPO on reward-model scores is higher than before
by at least ``--min-gain``. Exits 1 otherwise (``--no-check``: never). Writes the JSON result
and a PNG of the curves.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the benchmarks' shared helpers
from common import HYBRIDFLOW, child_env, cpu_kind, describe_machine, hardware_facts, machine_facts, run_logged, write_json  # noqa: E402

DEFAULT_MODEL = "smollm2-135m-instruct"
SOURCE = "hybridflow/arithmetic"
RULE_KEY = f"val-aux/{SOURCE}/rule_score/mean@1"  # the rule scorer beside the reward model
SCORE_KEY = f"val-core/{SOURCE}/reward/mean@1"  # the reward: the model's score, or the rule's


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=DEFAULT_MODEL, help=f"policy and RM base (default {DEFAULT_MODEL})")
    parser.add_argument("--work-dir", default=None, help="data, runs and logs (default: a new temp folder)")
    parser.add_argument("--pairs", type=int, default=1000, help="training pairs (default 1000)")
    parser.add_argument("--rm-steps", type=int, default=62, help="reward-model optimizer steps (default 62: one epoch)")
    parser.add_argument("--rm-batch", type=int, default=16, help="pairs per reward-model step (default 16)")
    parser.add_argument("--rm-lr", type=float, default=1e-4, help="reward-model learning rate (default 1e-4)")
    parser.add_argument("--steps", type=int, default=24, help="GRPO steps (default 24, the main job)")
    parser.add_argument("--val-every", type=int, default=8, help="validate every N GRPO steps (default 8)")
    parser.add_argument("--lr", type=float, default=1.5e-5, help="actor learning rate (default 1.5e-5, the main job)")
    parser.add_argument("--test-size", type=int, default=200, help="held-out arithmetic problems (default 200)")
    parser.add_argument("--seed", type=int, default=1, help="trainer seed (default 1)")
    parser.add_argument("--min-gain", type=float, default=0.05, help="required rise of held-out accuracy (default 0.05)")
    parser.add_argument("--no-rule-baseline", action="store_true", help="skip GRPO on the rule reward")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: all cores)")
    parser.add_argument("--out", default=None, help="JSON result (default <work-dir>/result.json)")
    parser.add_argument("--png", default=None, help="PNG of the curves (default <work-dir>/curves.png)")
    parser.add_argument("--no-check", action="store_true", help="report only; exit 0 even when the criterion fails")
    return parser


def rows_of(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]


def train_reward_model(exe: list[str], args: argparse.Namespace, work: Path, env: dict[str, str]) -> tuple[Path, dict]:
    pairs, run_dir = work / "pairs", work / "rm"
    walls = {"pairs data": run_logged([*exe, "data", "arithmetic-pairs", "--out", str(pairs), "--train-size",
                                       str(args.pairs), "--test-size", "200"], work / "pairs.log", env)}
    walls["rm"] = run_logged([
        *exe, "rm", f"model.path={args.model}", f"data.train_files=[{pairs / 'train.parquet'}]",
        f"data.val_files=[{pairs / 'test.parquet'}]", f"data.train_batch_size={args.rm_batch}",
        f"optim.lr={args.rm_lr}", f"trainer.total_training_steps={args.rm_steps}",
        f"trainer.test_freq={max(args.rm_steps // 5, 1)}", f"trainer.save_freq={args.rm_steps}",
        f"trainer.seed={args.seed}", "trainer.logger=[console,jsonl]", f"trainer.default_local_dir={run_dir}",
    ], work / "rm.log", env)
    rows = rows_of(run_dir)
    val = [(r["step"], r["val/accuracy"]) for r in rows if "val/accuracy" in r]
    train = [(r["step"], r["train/accuracy"], r["train/loss"]) for r in rows if "train/accuracy" in r]
    return run_dir / f"global_step_{args.rm_steps}" / "hf", {"val_accuracy": val, "train": train, "walls_s": walls}


def grpo(exe: list[str], args: argparse.Namespace, arith: Path, run_dir: Path, log: Path, env: dict[str, str],
         *reward: str) -> tuple[float, list[dict[str, Any]]]:
    wall = run_logged([
        *exe, "train", f"actor_rollout_ref.model.path={args.model}", f"actor_rollout_ref.actor.optim.lr={args.lr}",
        f"data.train_files=[{arith / 'train.parquet'}]", f"data.val_files=[{arith / 'test.parquet'}]",
        f"trainer.total_training_steps={args.steps}", f"trainer.test_freq={args.val_every}",
        "trainer.val_before_train=true", f"trainer.seed={args.seed}", "trainer.logger=[console,jsonl]",
        f"trainer.default_local_dir={run_dir}", f"trainer.validation_data_dir={run_dir / 'validation'}", *reward,
    ], log, env)
    return wall, rows_of(run_dir)


def summarize(rows: list[dict[str, Any]], rule_key: str) -> dict[str, Any]:
    """Per-step training reward (and rule score), per-validation held-out accuracy and score."""
    steps = [{"step": r["step"], "reward": r["critic/score/mean"], "rule": r.get("critic/rule_score/mean")}
             for r in rows if "critic/score/mean" in r]
    val = [{"step": r["step"], "accuracy": r[rule_key], "score": r[SCORE_KEY]} for r in rows if rule_key in r]
    return {"steps": steps, "val": val}


def hacking_findings(rm_run: dict[str, Any]) -> list[str]:
    """Where the reward model's score rose while the rule accuracy fell (held-out, or training thirds)."""
    found, val = [], rm_run["val"]
    for a, b in zip(val, val[1:]):
        if b["score"] > a["score"] and b["accuracy"] < a["accuracy"]:
            found.append(f"held-out, steps {a['step']}→{b['step']}: RM score {a['score']:+.3f}→{b['score']:+.3f}, "
                         f"rule accuracy {a['accuracy']:.3f}→{b['accuracy']:.3f}")
    steps = rm_run["steps"]
    third = max(len(steps) // 3, 1)
    first, last = steps[:third], steps[-third:]
    mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
    if mean([s["reward"] for s in last]) > mean([s["reward"] for s in first]) and \
            mean([s["rule"] for s in last]) < mean([s["rule"] for s in first]):
        found.append(f"training, first vs last third: RM score {mean([s['reward'] for s in first]):+.3f}→"
                     f"{mean([s['reward'] for s in last]):+.3f}, rule score {mean([s['rule'] for s in first]):.3f}→"
                     f"{mean([s['rule'] for s in last]):.3f}")
    return found


def rm_favoured_mistakes(dump: Path, top: int = 5) -> dict[str, Any]:
    """From one validation dump: the wrong answers (rule) the reward model scores highest, and
    how many wrong answers outscore the median right one."""
    rows = [json.loads(line) for line in dump.read_text().splitlines() if line.strip()]
    right = sorted(r["score"] for r in rows if r["rule_score"] >= 1.0)
    wrong = sorted((r for r in rows if r["rule_score"] < 1.0), key=lambda r: -r["score"])
    median = right[len(right) // 2] if right else float("inf")
    # how often the reward model ranks a right answer above a wrong one (0.5 = chance), on the policy's own answers
    ranked = sum((a > r["score"]) + 0.5 * (a == r["score"]) for a in right for r in wrong)
    return {"wrong": len(wrong), "right": len(right), "wrong_above_median_right": sum(r["score"] > median for r in wrong),
            "right_above_wrong": ranked / max(len(right) * len(wrong), 1),
            "top": [{k: r[k] for k in ("score", "gts", "output")} for r in wrong[:top]]}


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    work = Path(args.work_dir) if args.work_dir else Path(__import__("tempfile").mkdtemp(prefix="rm_pipeline_"))
    work.mkdir(parents=True, exist_ok=True)
    threads = args.threads or os.cpu_count() or 1
    env = child_env(threads)
    machine, hardware = machine_facts(), hardware_facts("auto", 512, threads)
    header = describe_machine(machine, hardware, threads)
    print("\n".join(header), flush=True)
    exe = HYBRIDFLOW
    rm_path, rm = train_reward_model(exe, args, work, env)
    walls = dict(rm.pop("walls_s"))
    arith = work / "arith"
    walls["arith data"] = run_logged([*exe, "data", "arithmetic", "--out", str(arith), "--train-size",
                                      str(4 * args.steps), "--test-size", str(args.test_size)], work / "arith.log", env)
    walls["grpo, RM reward"], rows = grpo(exe, args, arith, work / "grpo_rm", work / "grpo_rm.log", env,
                                          "reward_model.enable=true", f"reward_model.model.path={rm_path}",
                                          "reward_model.rule_reward=log")
    rm_run = summarize(rows, RULE_KEY)
    rule_run = None
    if not args.no_rule_baseline:
        walls["grpo, rule reward"], rows = grpo(exe, args, arith, work / "grpo_rule", work / "grpo_rule.log", env)
        rule_run = summarize(rows, SCORE_KEY)
    val = rm_run["val"]
    gain = val[-1]["accuracy"] - val[0]["accuracy"]
    findings = hacking_findings(rm_run)
    examples = rm_favoured_mistakes(work / "grpo_rm" / "validation" / f"{val[-1]['step']}.jsonl")
    checks = {f"held-out rule accuracy rises by ≥ {args.min_gain} with the reward model as the only reward":
              gain >= args.min_gain}
    kind = cpu_kind(machine, hardware)
    lines = ["", f"=== reward model → GRPO on its scores ({kind})", *header, "",
             "reward model, held-out pair accuracy: " + ", ".join(f"step {s}: {a:.3f}" for s, a in rm["val_accuracy"]),
             "", "GRPO with the reward model as the only reward:", "step | RM score (reward) | rule score (logged)"]
    lines += [f"{s['step']:>4} | {s['reward']:>17.3f} | {s['rule']:>19.3f}" for s in rm_run["steps"]]
    lines += ["held-out (greedy): " + ", ".join(f"step {v['step']}: accuracy {v['accuracy']:.3f}, RM score "
                                               f"{v['score']:+.3f}" for v in val), f"gain: {gain:+.3f}"]
    if rule_run is not None:
        lines += ["", "GRPO with the rule reward (the main job's reward), held-out accuracy: "
                  + ", ".join(f"step {v['step']}: {v['accuracy']:.3f}" for v in rule_run["val"])]
    lines += ["", "reward hacking (RM score up while rule accuracy down): " + ("; ".join(findings) or "not seen"),
              f"last validation: the reward model ranks a right answer above a wrong one in "
              f"{examples['right_above_wrong']:.0%} of (right, wrong) pairs; of {examples['wrong']} wrong answers "
              f"{examples['wrong_above_median_right']} score above the median right one; the highest-scored wrong ones:",
              *[f"  RM {e['score']:+.2f}  truth {e['gts']}  response {e['output']!r}" for e in examples["top"]],
              "wall time: " + ", ".join(f"{k} {v:.0f} s" for k, v in walls.items()), "",
              *[f"[{'PASS' if ok else 'FAIL'}] {name}" for name, ok in checks.items()]]
    print("\n".join(lines))
    out = Path(args.out) if args.out else work / "result.json"
    write_json(out, {"settings": vars(args), "machine": machine, "hardware": hardware, "walls_s": walls,
                     "reward_model": rm, "grpo_rm": rm_run, "grpo_rule": rule_run, "hacking": findings,
                     "rm_favoured_mistakes": examples,
                     "checks": checks, "work_dir": str(work)})
    png = Path(args.png) if args.png else work / "curves.png"
    plot(rm, rm_run, rule_run, png, f"SmolLM2-135M: reward model, then GRPO on its scores ({kind})")
    print(f"result: {out}\ncurves: {png}")
    return 0 if args.no_check or all(checks.values()) else 1


def plot(rm: dict[str, Any], rm_run: dict[str, Any], rule_run: dict[str, Any] | None, png: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    left.plot([s for s, _ in rm["val_accuracy"]], [a for _, a in rm["val_accuracy"]], marker="o", color="tab:purple")
    left.set(xlabel="reward-model step", ylabel="held-out pair accuracy", ylim=(0.4, 1.02), title="1. hybridflow rm")
    left.grid(alpha=0.3)
    steps, val = rm_run["steps"], rm_run["val"]
    right.plot([s["step"] for s in steps], [s["rule"] for s in steps], ".", color="tab:blue", alpha=0.5,
               label="training: rule score of the samples (logged, not trained on)")
    right.plot([v["step"] for v in val], [v["accuracy"] for v in val], "o-", color="tab:green",
               label="held-out accuracy (rule), RM reward")
    if rule_run is not None:
        right.plot([v["step"] for v in rule_run["val"]], [v["accuracy"] for v in rule_run["val"]], "s--",
                   color="tab:gray", label="held-out accuracy, rule reward (main job)")
    right.set(xlabel="GRPO step", ylabel="accuracy", ylim=(-0.02, 1.02), title="2. GRPO on the reward model's score")
    score = right.twinx()
    score.plot([s["step"] for s in steps], [s["reward"] for s in steps], color="tab:red", alpha=0.6,
               label="training: RM score (the reward)")
    score.set_ylabel("RM score", color="tab:red")
    right.grid(alpha=0.3)
    handles = right.get_legend_handles_labels()[0] + score.get_legend_handles_labels()[0]
    right.legend(handles, [h.get_label() for h in handles], loc="upper left", fontsize=7, framealpha=0.6)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
