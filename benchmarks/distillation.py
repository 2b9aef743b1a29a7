"""On-policy distillation on the main job: a GRPO-trained teacher, a fresh student, no task reward.

    python benchmarks/distillation.py [--teacher-steps 24] [--steps 24] [--seed 1] [--out result.json]

1. **Teacher** (= the plain GRPO baseline): the main job (GRPO on the arithmetic task,
   SmolLM2-135M, 4 prompts × 4 samples per step) for ``--teacher-steps`` steps with a checkpoint
   at the end, exported to a Hugging Face folder (``hybridflow export merge``).
2. **Distill**: a fresh SmolLM2 student with ``distillation.teacher_model.model_path`` = that
   folder and ``distillation.reward_weight=0`` (no task reward at all; the arithmetic scores are
   computed and logged, never trained on). The loss is ``--loss``: k3 as a loss term (default),
   k1 folded into the advantage (each sampled token's reward is ℓ_teacher − ℓ_old), or
   forward_kl_topk (K = 32) as a loss term.
3. **Controls**: the same run with the teacher = the student's own initial weights, twice:
   ``control`` as the main job runs (bf16 teacher weights; the student's log-probs come from fp32
   weights under bf16 autocast, so the two differ by rounding: a noise floor of a few thousandths
   of a nat per token), and ``control_fp32`` with student and teacher in fp32 and no weight decay,
   where the teacher's log-probs equal the student's bit for bit: every token's reward is exactly
   0 and the student must not move at all.

Reported: held-out greedy accuracy of each (before, every 8 steps), the sampled accuracy on the
training prompts over the first and last 6 steps, the student–teacher KL
(``distill/kl``: mean ℓ_student − ℓ_teacher over the student's own sampled tokens) over the first
and last 4 steps, and samples per second (rows ÷ median step) of the distillation run against
plain GRPO (the teacher's run: the same prompts, samples per step and model; response lengths
differ as the policies differ). Equal work per step except the teacher's forward pass, which is
the difference measured, and, for k1 folded, ℓ_old: the folded reward needs the student's
log-probs before the update, which plain on-policy GRPO skips.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (  # noqa: E402
    HYBRIDFLOW,
    child_env, describe_machine, hardware_facts, machine_facts, main_job_task, run_logged, write_json,
)

LOSSES: dict[str, list[str]] = {
    "k1": ["distillation.distillation_loss.loss_mode=k1", "distillation.distillation_loss.use_policy_gradient=true"],
    "k3": ["distillation.distillation_loss.loss_mode=k3", "distillation.distillation_loss.use_policy_gradient=false"],
    "forward_kl_topk": ["distillation.distillation_loss.loss_mode=forward_kl_topk",
                        "distillation.distillation_loss.use_policy_gradient=false",
                        "distillation.distillation_loss.topk=32"],
}
STUDENT = "smollm2-135m-instruct"  # the main job's model (actor_rollout_ref.model.path's default)


def _rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]


def summarize(rows: list[dict], wall: float, rows_per_step: int) -> dict:
    steps = [r for r in rows if "timing_s/step" in r]
    median = statistics.median(r["timing_s/step"] for r in steps)
    out = {
        "val": [(r["step"], r["val-core/mean"]) for r in rows if "val-core/mean" in r],
        "wall_s": wall,
        "median_step_s": median,
        "samples_per_s": rows_per_step / median,
        "median_teacher_s": statistics.median(r.get("timing_s/teacher", 0.0) for r in steps),
        # sampled accuracy on the training prompts (scored, never trained on in the distillation runs)
        "score_first": statistics.mean(r["critic/score/mean"] for r in steps[:6]),
        "score_last": statistics.mean(r["critic/score/mean"] for r in steps[-6:]),
    }
    if "distill/kl" in steps[0]:
        kl = [r["distill/kl"] for r in steps]
        out["kl"] = kl
        out["kl_first"] = statistics.mean(kl[:4])
        out["kl_last"] = statistics.mean(kl[-4:])
        out["teacher_logp"] = [r["distill/teacher_logp"] for r in steps]
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--teacher-steps", type=int, default=24)
    parser.add_argument("--steps", type=int, default=24, help="distillation steps")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--loss", default="k3", choices=sorted(LOSSES))
    parser.add_argument("--lr", type=float, default=None, help="student learning rate (default: the main job's)")
    parser.add_argument("--no-control", action="store_true", help="skip the teacher = student control runs")
    parser.add_argument("--model", default=STUDENT, help="the student (and the teacher's start); default: the main job's")
    parser.add_argument("--work-dir", default="distill_bench")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    work = Path(args.work_dir).resolve()
    work.mkdir(parents=True, exist_ok=True)
    env = child_env(args.threads)
    machine, hardware = machine_facts(), hardware_facts("auto", 256, args.threads)
    task = main_job_task(work, env)
    common = [f"trainer.seed={args.seed}", "trainer.test_freq=8", "trainer.logger=[jsonl]",
              f"data.train_files=[{task / 'train.parquet'}]", f"data.val_files=[{task / 'test.parquet'}]",
              f"actor_rollout_ref.model.path={args.model}"]
    rows_per_step = 16  # the main job: 4 prompts × rollout.n = 4

    # 1. the teacher: the main job with a checkpoint at its last step; its step times are the
    #    plain-GRPO baseline, so it runs in every invocation (same machine state as the others)
    teacher_run, teacher_hf = work / "teacher_run", work / "teacher_hf"
    shutil.rmtree(teacher_run, ignore_errors=True)
    wall = run_logged([*HYBRIDFLOW, "train", *common, f"trainer.total_training_steps={args.teacher_steps}",
                       f"trainer.save_freq={args.teacher_steps}", f"trainer.default_local_dir={teacher_run}"],
                      work / "teacher.log", env)
    run_logged([*HYBRIDFLOW, "export", "merge", "--local_dir", str(teacher_run / f"global_step_{args.teacher_steps}"),
                "--target_dir", str(teacher_hf)], work / "export.log", env)
    results: dict[str, dict] = {"grpo_teacher": summarize(_rows(teacher_run), wall, rows_per_step)}

    # 2. distillation into a fresh student, no task reward; 3. the control: teacher = student
    exact = ["actor_rollout_ref.model.dtype=fp32", "distillation.teacher_model.dtype=fp32",
             "actor_rollout_ref.actor.optim.weight_decay=0"]
    runs = {"distill": (str(teacher_hf), [])}
    if not args.no_control:
        runs |= {"control": (args.model, []), "control_fp32": (args.model, exact)}
    for name, (teacher, extra) in runs.items():
        run_dir = work / f"{name}_{args.loss}"
        shutil.rmtree(run_dir, ignore_errors=True)  # a fresh run, not a resume of an earlier one
        cmd = [*HYBRIDFLOW, "train", *common, f"trainer.total_training_steps={args.steps}",
               f"trainer.default_local_dir={run_dir}", "distillation.enabled=true",
               f"distillation.teacher_model.model_path={teacher}", "distillation.reward_weight=0", *LOSSES[args.loss],
               # the clamps the documented numbers were measured with (the defaults before verl's null)
               "distillation.distillation_loss.loss_max_clamp=10", "distillation.distillation_loss.log_prob_min_clamp=-10",
               *extra]
        if args.lr is not None:
            cmd.append(f"actor_rollout_ref.actor.optim.lr={args.lr}")
        wall = run_logged(cmd, work / f"{name}_{args.loss}.log", env)
        results[name] = summarize(_rows(run_dir), wall, rows_per_step)

    print("\n".join(describe_machine(machine, hardware, args.threads)))
    print(f"seed {args.seed}; loss {args.loss}; held-out greedy accuracy every 8 steps; no task reward in the "
          "distillation runs")
    print(f"{'run':<13} {'held-out':<30} {'train score':<15} {'KL first→last 4':<17} {'step s':>6} "
          f"{'samples/s':>9} {'wall s':>6}")
    for name, r in results.items():
        val = " ".join(f"{v:.3f}" for _, v in r["val"])
        score = f"{r['score_first']:.3f} → {r['score_last']:.3f}"
        kl = f"{r['kl_first']:.3f} → {r['kl_last']:.3f}" if "kl" in r else "-"
        print(f"{name:<13} {val:<30} {score:<15} {kl:<17} {r['median_step_s']:6.2f} {r['samples_per_s']:9.2f} "
              f"{r['wall_s']:6.0f}")
    d, g = results["distill"], results["grpo_teacher"]
    fall = 1.0 - d["kl_last"] / d["kl_first"] if d["kl_first"] else float("nan")
    print(f"student–teacher KL falls by {100 * fall:.0f}%; distillation runs at {d['samples_per_s'] / g['samples_per_s']:.2f}× "
          f"plain GRPO's samples/s (teacher forward {d['median_teacher_s']:.2f} s of a {d['median_step_s']:.2f} s step)")
    if args.out:
        write_json(args.out, {"machine": machine, "hardware": hardware, "loss": args.loss, "results": results})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
