"""GRPO step speed: hybridflow's trainer vs TRL's ``GRPOTrainer`` on the same job, same run.

    pip install "torch==2.13.0" -e ".[bench]"      # trl==1.16.0
    python benchmarks/grpo_vs_trl.py                # SmolLM2-135M-Instruct, dtype auto, both modes, 3 repetitions
    python benchmarks/grpo_vs_trl.py --modes equal --repeats 5
    python benchmarks/grpo_vs_trl.py --fast         # tiny random model: checks that both sides run

The job (identical on both sides): the built-in arithmetic task's first prompts in file order,
8 prompts × 4 samples per step, at most 64 new tokens, temperature 1.0, GRPO advantages
normalised by the group std, clipped policy loss (ε = 0.2) with a token-mean over the batch,
k3 KL to a reference model in the loss (hybridflow ``kl_loss_type=low_var_kl``, TRL ``beta``),
one AdamW step per batch (constant lr, weight decay 0, grad-norm clip 1.0), micro-batches
of 8 responses, the same dtype (``--dtype auto``: what hybridflow's auto rule picks on this
CPU, given to both sides), the same attention kernel (the one hybridflow picks, passed to TRL's
``model_init_kwargs``), seed and thread count.

Two modes: **equal** (the headline) makes every response exactly ``--max-new-tokens`` long on
both sides (hybridflow ``rollout.ignore_eos``, TRL ``min_new_tokens``), so a difference in
sampled lengths cannot move the ratio; **free** lets each side stop at EOS as in training.
Each (mode, repetition) runs both sides in their own processes (``_hybridflow_side.py``,
``_trl_side.py``), one after the other, alternating which goes first: one warm-up step, then
``--steps`` timed steps. Printed (and written to ``--out``): the CPU, its flags and the dtype
decision; per mode the TRL / hybridflow ratio of the median step time of every repetition, their
median and min–max, the peak-RSS ratio, the detailed table of the median repetition, and the
work each side does per step — so any difference in what is computed is stated, not hidden.
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
    compare,
    describe_machine,
    format_speed_report,
    hardware_facts,
    machine_facts,
    run_side,
    summarize_steps,
    write_arithmetic_task,
    write_json,
)

FAST_MODEL = "tiny-llama"
DEFAULT_MODEL = "smollm2-135m-instruct"
MODES = ("equal", "free")
HEADLINE_MODE = "equal"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help=f"model name or HF folder (default {DEFAULT_MODEL})")
    parser.add_argument("--fast", action="store_true", help=f"the tiny random model ({FAST_MODEL}): a quick check")
    parser.add_argument("--steps", type=int, default=2, help="timed steps per side and repetition (default 2)")
    parser.add_argument("--repeats", type=int, default=3, help="repetitions per mode, alternating the order (default 3)")
    parser.add_argument("--modes", default=",".join(MODES),
                        help="equal (every response max-new-tokens long), free (stop at EOS), or both (default)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed warm-up steps first (default 1)")
    parser.add_argument("--prompts", type=int, default=8, help="prompts per step (default 8)")
    parser.add_argument("--samples", type=int, default=4, help="samples per prompt (default 4)")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--lr", type=float, default=1e-6)
    parser.add_argument("--kl-coef", type=float, default=0.001, help="KL coefficient β on both sides")
    parser.add_argument("--micro-batch", type=int, default=8, help="responses per forward/backward pass")
    parser.add_argument("--dtype", choices=("auto", "fp32", "bf16"), default="auto",
                        help="compute dtype of both sides; auto = hybridflow's rule on this CPU (default)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="torch threads (default: cores)")
    parser.add_argument("--sides", default="hybridflow,trl", help="which sides; the first runs first in repetition 1")
    parser.add_argument("--work-dir", default=None, help="scratch folder (default: a new temporary folder)")
    parser.add_argument("--out", default=None, help="result JSON (default WORK_DIR/grpo_vs_trl.json)")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds allowed per side")
    return parser


def resolve_model(name: str) -> str:
    """A local HF folder for ``name`` (TRL needs a folder on disk when its KL coefficient is > 0)."""
    from hybridflow.models import resolve_model_path

    return str(resolve_model_path(name))


def settings_for(args: argparse.Namespace, model: str, train_file: Path, run_dir: Path, dtype: str,
                 equal_work: bool, attn_implementation: str = "auto") -> BenchSettings:
    return BenchSettings(
        model=model, train_file=str(train_file), run_dir=str(run_dir), prompts_per_step=args.prompts,
        samples_per_prompt=args.samples, max_new_tokens=args.max_new_tokens, temperature=args.temperature,
        lr=args.lr, kl_coef=args.kl_coef, micro_batch=args.micro_batch, dtype=dtype, seed=args.seed,
        threads=args.threads, warmup_steps=args.warmup, steps=args.steps, equal_work=equal_work,
        attn_implementation=attn_implementation,
    )


def parse_list(text: str, valid: tuple[str, ...] | dict, what: str) -> list[str]:
    items = [s.strip() for s in text.split(",") if s.strip()]
    unknown = [s for s in items if s not in valid]
    if unknown or not items:
        raise SystemExit(f"{what}: unknown {unknown}; valid: {', '.join(valid)}")
    return items


def run_mode(args: argparse.Namespace, mode: str, sides: list[str], model: str, data: Path, work: Path,
             hardware: dict[str, Any]) -> dict[str, Any]:
    """``--repeats`` repetitions of both sides on one mode, alternating which side runs first.

    TRL is given the attention kernel hybridflow reported picking (hybridflow asks ``auto``).
    """
    attn = "auto"
    reps: list[dict[str, Any]] = []
    for rep in range(args.repeats):
        order = side_order(sides, rep)
        results: dict[str, Any] = {}
        for side in order:
            if side == "trl" and attn == "auto":
                attn = hardware["attn_implementation"]  # hybridflow's choice for these rows, until it reports one
            print(f"[{mode} {rep + 1}/{args.repeats}] running the {side} side ...", flush=True)
            settings = settings_for(args, model, data / "train.parquet", work / mode / f"rep{rep + 1}" / side,
                                    hardware["dtype"], mode == "equal", attn if side == "trl" else "auto")
            results[side] = run_side(side, settings, timeout_s=args.timeout)
            attn = results[side].get("attn_implementation", attn) if side == "hybridflow" else attn
        rep_out: dict[str, Any] = {"order": order, **results,
                                   "summary": {side: summarize_steps(r) for side, r in results.items()}}
        if {"hybridflow", "trl"} <= results.keys():
            rep_out["ratios"] = compare(results["hybridflow"], results["trl"])
            rep_out["same_first_prompts"] = results["hybridflow"]["first_prompt_ids"] == results["trl"]["first_prompt_ids"]
        reps.append(rep_out)
    return {"repetitions": reps, "ratio_summary": ratio_summary(reps)}


def side_order(sides: list[str], rep: int) -> list[str]:
    """Running order of repetition ``rep`` (0-based): as given, then reversed, alternating."""
    return list(sides) if rep % 2 == 0 else list(sides)[::-1]


def ratio_summary(reps: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Median and min–max over the repetitions of each TRL / hybridflow ratio."""
    out: dict[str, dict[str, float]] = {}
    for key in (reps[0].get("ratios") or {}):
        values = [rep["ratios"][key] for rep in reps]
        out[key] = {"median": statistics.median(values), "min": min(values), "max": max(values), "values": values}
    return out


def run_comparison(args: argparse.Namespace) -> dict[str, Any]:
    """Both sides on one job, in every mode and repetition; returns the full result (``--out``)."""
    sides = parse_list(args.sides, SIDES, "--sides")
    modes = parse_list(args.modes, MODES, "--modes")
    if args.repeats < 1:
        raise SystemExit("--repeats must be at least 1")
    work = Path(args.work_dir or tempfile.mkdtemp(prefix="grpo_vs_trl-")).resolve()
    model = resolve_model(args.model or (FAST_MODEL if args.fast else DEFAULT_MODEL))
    data = write_arithmetic_task(work / "data", train_size=args.prompts * (args.warmup + args.steps), test_size=8)
    machine = machine_facts()
    # Rows hold ≤ ~60 prompt + max_new_tokens tokens: the attention kernel hybridflow would pick.
    hardware = hardware_facts(args.dtype, 64 + args.max_new_tokens, args.threads)
    print(f"model {model}; work folder {work}")
    print("\n".join(describe_machine(machine, hardware, args.threads)), flush=True)
    base = settings_for(args, model, data / "train.parquet", work, hardware["dtype"], HEADLINE_MODE in modes)
    out: dict[str, Any] = {"settings": asdict(base) | {"run_dir": str(work)}, "machine": machine,
                           "hardware": hardware, "threads": args.threads, "repeats": args.repeats}
    out["modes"] = {mode: run_mode(args, mode, sides, model, data, work, hardware) for mode in modes}
    out["finished"] = time.strftime("%Y-%m-%d %H:%M:%S")
    return out


def median_repetition(mode_result: dict[str, Any]) -> dict[str, Any]:
    """The repetition whose step-time ratio is the median one (the lower middle for an even count)."""
    reps = mode_result["repetitions"]
    if "ratios" not in reps[0]:
        return reps[0]
    ranked = sorted(reps, key=lambda r: r["ratios"]["step_time_trl_over_hybridflow"])
    return ranked[(len(ranked) - 1) // 2]


def format_result(result: dict[str, Any]) -> str:
    lines = describe_machine(result["machine"], result["hardware"], result["threads"])
    for mode, mode_result in result["modes"].items():
        rep = median_repetition(mode_result)
        lines.append("")
        title = "equal work: every response exactly max-new-tokens long" if mode == "equal" else "free length: stop at EOS"
        lines.append(f"=== mode {mode} ({title}) ===")
        summary = mode_result["ratio_summary"]
        if not summary:
            lines += [f"{side}: {rep['summary'][side]}" for side in rep["summary"]]
            continue
        st, rss = summary["step_time_trl_over_hybridflow"], summary["peak_rss_trl_over_hybridflow"]
        lines.append(
            f"TRL / hybridflow step time: median {st['median']:.2f} (min {st['min']:.2f}, max {st['max']:.2f}) over "
            f"{len(st['values'])} alternating repetitions: {', '.join(f'{v:.2f}' for v in st['values'])}"
        )
        lines.append(f"TRL / hybridflow peak RSS: median {rss['median']:.2f} (min {rss['min']:.2f}, max {rss['max']:.2f})")
        lines.append(f"the median repetition ({' first, then '.join(rep['order'])}):")
        settings = BenchSettings(**{**result["settings"], "equal_work": mode == "equal",
                                    "attn_implementation": rep["hybridflow"].get("attn_implementation", "auto")})
        lines.append(format_speed_report(settings, rep["hybridflow"], rep["trl"]))
        lines.append(f"same prompt tokens on both sides (first step): {rep['same_first_prompts']}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    result = run_comparison(args)
    out = Path(args.out) if args.out else Path(result["settings"]["run_dir"]) / "grpo_vs_trl.json"
    write_json(out, result)
    print(format_result(result))
    print(f"result: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
