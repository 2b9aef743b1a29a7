"""Asynchronous training on the main job: synchronous vs one-step-off vs fully async.

    python benchmarks/async_training.py [--steps 24] [--seed 1] [--threads 2] [--out result.json]

Runs ``hybridflow train`` (the main job: GRPO on the arithmetic task, SmolLM2-135M, 4 prompts
× 4 samples per step) three times with the same seed and the same number of samples:

* sync — the default (the rollout samples from the actor's live module);
* one_step_off — ``async_training.mode=one_step_off``: batch k+1 is generated with θ_k while
  θ_k+1 is computed from batch k (bypass correction, a rollout copy synced each step);
* fully_async — ``async_training.mode=fully_async`` with chunks of 2 prompts, 2 chunks per
  update, a sync every 2 updates and staleness ≤ 2;
* fully_async_partial (only with ``--modes``) — the same with ``partial_rollout=true``.

For each it reports held-out greedy accuracy (before, every 8 steps), the wall time, the
median step, and for the async runs the measured overlap (time both the rollouter and the
trainer were busy ÷ wall time). Equal work: the same prompts, samples per step and steps on
every side; what differs is when the samples are generated and with which weights.

On a 2-core machine generation and training share the same cores, so overlap cannot make a
step faster (both sides slow down); the report also predicts the gain on hardware where the
two sides do not compete (separate cores or devices) from the synchronous run's own phase
times: per step max(gen, train) instead of gen + train.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (  # noqa: E402
    HYBRIDFLOW,
    child_env, describe_machine, hardware_facts, machine_facts, main_job_task, run_logged, write_json,
)

MODES: dict[str, list[str]] = {
    "sync": [],
    "one_step_off": ["async_training.mode=one_step_off"],
    "fully_async": ["async_training.mode=fully_async", "async_training.staleness_threshold=2",
                    "async_training.trigger_parameter_sync_step=2", "async_training.require_batches=2",
                    "actor_rollout_ref.actor.ppo_mini_batch_size=2"],
}
# Not run by default: fully_async whose syncs abort the chunk in flight and resume it (--modes ...).
MODES["fully_async_partial"] = [*MODES["fully_async"], "async_training.partial_rollout=true"]
DEFAULT_MODES = ("sync", "one_step_off", "fully_async")


def summarize(rows: list[dict], wall: float) -> dict:
    steps = [r for r in rows if "timing_s/step" in r]
    last = steps[-1]
    gen = [r.get("timing_s/gen", 0.0) for r in steps]
    out = {
        "val": [(r["step"], r["val-core/mean"]) for r in rows if "val-core/mean" in r],
        "wall_s": wall,
        "median_step_s": statistics.median(r["timing_s/step"] for r in steps),
        "steps_s": sum(r["timing_s/step"] for r in steps),
        "median_gen_s": statistics.median(gen),
        "median_sync_s": statistics.median(r.get("timing_s/sync_weights", 0.0) for r in steps),
    }
    if "fully_async/overlap_fraction" in last:
        out |= {k.split("/")[-1]: last[k] for k in ("fully_async/overlap_fraction", "fully_async/rollouter_busy_fraction",
                                                  "fully_async/trainer_busy_fraction")}
        out["median_wait_s"] = statistics.median(r["timing_s/wait_samples"] for r in steps)
        out["staleness_max"] = max(r["fully_async/staleness/max"] for r in steps)
        out["dropped"] = last["fully_async/dropped_samples_total"]
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--modes", default=",".join(DEFAULT_MODES), help=f"comma-separated, of {', '.join(MODES)}")
    parser.add_argument("--model", default=None, help="model folder or name (default: the main job's)")
    parser.add_argument("--work-dir", default="async_bench")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    work = Path(args.work_dir).resolve()
    work.mkdir(parents=True, exist_ok=True)
    machine, hardware = machine_facts(), hardware_facts("auto", 256, args.threads)
    task = main_job_task(work, child_env(args.threads))
    results = {}
    for mode in args.modes.split(","):
        run_dir = work / mode
        cmd = [*HYBRIDFLOW, "train", f"trainer.seed={args.seed}", f"trainer.total_training_steps={args.steps}",
               "trainer.test_freq=8", f"trainer.default_local_dir={run_dir}", "trainer.logger=[jsonl]",
               f"data.train_files=[{task / 'train.parquet'}]", f"data.val_files=[{task / 'test.parquet'}]",
               *MODES[mode]]
        if args.model:
            cmd.append(f"actor_rollout_ref.model.path={args.model}")
        wall = run_logged(cmd, work / f"{mode}.log", child_env(args.threads))
        rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
        results[mode] = summarize(rows, wall)

    print("\n".join(describe_machine(machine, hardware, args.threads)))
    print(f"main job, {args.steps} steps, seed {args.seed}; held-out greedy accuracy at steps 0/8/16/24")
    print(f"{'mode':<13} {'held-out':<34} {'wall s':>7} {'step s':>7} {'overlap':>8} {'stale≤':>7}")
    for mode, r in results.items():
        val = " ".join(f"{v:.3f}" for _, v in r["val"])
        overlap = f"{r['overlap_fraction']:.2f}" if "overlap_fraction" in r else "-"
        stale = f"{r['staleness_max']:.0f}" if "staleness_max" in r else "-"
        print(f"{mode:<13} {val:<34} {r['wall_s']:7.0f} {r['median_step_s']:7.2f} {overlap:>8} {stale:>7}")
    if "sync" in results:
        s = results["sync"]
        gen, step = s["median_gen_s"], s["median_step_s"]
        train = step - gen
        print(f"sync phases: gen {gen:.2f} s + train {train:.2f} s per step; with the two sides on separate "
              f"hardware a one-step-off step takes max = {max(gen, train):.2f} s: predicted speed-up "
              f"{step / max(gen, train):.2f}× (+ the weight sync, {results.get('one_step_off', {}).get('median_sync_s', 0):.2f} s "
              "here)")
    if args.out:
        write_json(args.out, {"machine": machine, "hardware": hardware, "results": results})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
