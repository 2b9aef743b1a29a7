"""Does a vision-language model learn from GRPO beyond its SFT start? The tiny Qwen2-VL on ``shapes``.

    python benchmarks/vlm_shapes.py                       # the documented run (docs/vision.md)
    python benchmarks/vlm_shapes.py --sft-steps 2 --grpo-steps 2 --test-size 8   # a quick look

Four steps, each a CLI command in a child process (as a user would run them):

1. a seeded random Qwen2-VL (``hybridflow.models.tiny_vlm.build_tiny_vlm``: ``--layers`` language
   layers of width ``--hidden``, the 2-block vision tower) is saved as a model folder;
2. ``hybridflow data shapes`` writes the images, the RL prompts (train/test) and the SFT
   conversations (``--kinds``: the question kinds; disjoint train and held-out images);
3. ``hybridflow sft`` trains on the conversations for ``--sft-steps`` steps only: a partial warm
   start that gets the answer's wording and some of the content, not all of it;
4. ``hybridflow train`` (GRPO) starts from the SFT step's Hugging Face folder, with greedy
   accuracy on every held-out prompt before the first update (= the SFT checkpoint) and every
   ``--test-freq`` steps.

Each ``metrics.jsonl`` line of both runs is stamped with the wall time since the benchmark's
first training command started. Prints a Markdown table (phase, step, wall s, held-out accuracy
± its standard error sqrt(p(1-p)/n)), the gain of GRPO over the SFT checkpoint, writes
``--out``/vlm_shapes.json and the curves PNG (``--png``). Not a test.
"""

from __future__ import annotations

import argparse
import math
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchmarks/common.py

from common import HYBRIDFLOW, REPO_ROOT, child_env, follow_metrics, machine_facts, tail, write_json  # noqa: E402

ACC_PREFIX = "val-core/hybridflow/shapes/"


def build_model(folder: Path, layers: int, hidden: int, seed: int) -> None:
    """Save a seeded random tiny Qwen2-VL of ``layers`` × ``hidden`` with its processor."""
    sys.path.insert(0, str(REPO_ROOT))
    from hybridflow.models.processor import declare_processor_class
    from hybridflow.models.tiny_vlm import build_tiny_vlm, build_tiny_vlm_processor, build_tiny_vlm_tokenizer

    tokenizer = build_tiny_vlm_tokenizer()
    model = build_tiny_vlm(tokenizer, num_layers=layers, hidden_size=hidden, seed=seed)
    model.save_pretrained(folder, safe_serialization=True)
    build_tiny_vlm_processor(tokenizer).save_pretrained(folder)
    declare_processor_class(folder, "Qwen2VLProcessor")
    params = sum(p.numel() for p in model.parameters())
    print(f"model: tiny Qwen2-VL, {layers} layers × {hidden} wide, {params / 1e3:.0f}k parameters, seed {seed}")


def data_command(task: Path, args: argparse.Namespace) -> list[str]:
    return [*HYBRIDFLOW, "data", "shapes", "--out", str(task), "--train-size", str(args.train_size),
            "--test-size", str(args.test_size), "--kinds", args.kinds, "--seed", str(args.seed)]  # fmt: skip


def sft_command(model: Path, task: Path, run_dir: Path, args: argparse.Namespace) -> list[str]:
    return [
        *HYBRIDFLOW,
        "sft",
        f"model.path={model}",
        f"data.train_files={task / 'sft.parquet'}",
        f"data.val_files={task / 'sft.parquet'}",
        "data.multiturn.enable=true",
        "data.multiturn.messages_key=messages",
        f"data.train_batch_size={args.sft_batch}",
        f"data.micro_batch_size_per_gpu={args.sft_batch}",
        "data.max_length=96",
        f"optim.lr={args.sft_lr}",
        "optim.lr_scheduler_type=constant",
        f"trainer.total_training_steps={args.sft_steps}",
        "trainer.logger=[jsonl]",
        f"trainer.seed={args.seed}",
        f"trainer.default_local_dir={run_dir}",
    ]


def grpo_command(model: Path, task: Path, run_dir: Path, args: argparse.Namespace) -> list[str]:
    return [
        *HYBRIDFLOW,
        "train",
        f"actor_rollout_ref.model.path={model}",
        "actor_rollout_ref.model.dtype=fp32",
        f"data.train_files=[{task / 'train.parquet'}]",
        f"data.val_files=[{task / 'test.parquet'}]",
        f"data.train_batch_size={args.prompts}",
        "data.max_prompt_length=64",
        f"data.max_response_length={args.response_length}",
        f"actor_rollout_ref.rollout.n={args.n}",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={args.prompts}",
        f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={args.prompts * args.n}",
        f"actor_rollout_ref.actor.optim.lr={args.grpo_lr}",
        f"trainer.total_training_steps={args.grpo_steps}",
        "trainer.val_before_train=true",
        f"trainer.test_freq={args.test_freq}",
        "trainer.save_freq=-1",
        "trainer.logger=[jsonl]",
        f"trainer.seed={args.seed}",
        f"trainer.default_local_dir={run_dir}",
        *args.set,
    ]


def run_stamped(cmd: list[str], run_dir: Path, log: Path, env: dict[str, str], start: float) -> list[dict[str, Any]]:
    """Run one training command; its metrics lines stamped with the wall time since ``start``."""
    print("$ " + " ".join(cmd), flush=True)
    stamped: list[dict[str, Any]] = []
    done = threading.Event()
    follower = threading.Thread(target=follow_metrics, args=(run_dir / "metrics.jsonl", start, done, stamped))
    follower.start()
    with log.open("w") as out:
        rc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=REPO_ROOT).returncode
    done.set()
    follower.join()
    if rc != 0:
        raise SystemExit(f"{cmd[3]} failed (exit {rc}); last lines of {log}:\n{tail(log, 30)}")
    print(f"  done at {time.perf_counter() - start:.0f} s (log: {log})", flush=True)
    return stamped


def accuracy_key(row: dict[str, Any]) -> str | None:
    """The held-out greedy accuracy key of a validation line (all kinds together), if any."""
    keys = [k for k in row if k.startswith(ACC_PREFIX) and k.endswith("/acc/mean@1")]
    keys = keys or [k for k in row if k.startswith(ACC_PREFIX) and k.endswith("/mean@1")]
    return keys[0] if keys else None


def standard_error(p: float, n: int) -> float:
    return math.sqrt(max(p * (1 - p), 0.0) / n) if n else float("nan")


def table_rows(sft: list[dict[str, Any]], grpo: list[dict[str, Any]], sft_steps: int, n_test: int) -> list[dict]:
    """(phase, step, wall s, accuracy, standard error): the SFT checkpoint is GRPO's step-0 validation."""
    rows: list[dict[str, Any]] = []
    sft_end = max((r["wall_s"] for r in sft), default=0.0)
    for r in grpo:
        key = accuracy_key(r)
        if key is None:
            continue
        step = int(r.get("step", 0))
        phase, shown = ("sft", sft_steps) if step == 0 else ("grpo", step)
        acc = float(r[key])
        wall = sft_end if step == 0 else r["wall_s"]
        rows.append(
            {"phase": phase, "step": shown, "wall_s": round(wall, 1), "acc": acc, "se": standard_error(acc, n_test)}
        )
    return rows


def plot(png: Path, title: str, sft: list[dict[str, Any]], grpo: list[dict[str, Any]], table: list[dict]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, loss_ax) = plt.subplots(1, 2, figsize=(10, 4.2), gridspec_kw={"width_ratios": [2, 1]})
    xs = [r["wall_s"] / 60 for r in table]
    ax.errorbar(xs, [r["acc"] for r in table], yerr=[r["se"] for r in table], fmt="o-", capsize=3,
                label="held-out accuracy (greedy) ± s.e.")  # fmt: skip
    if table:
        ax.annotate("SFT checkpoint", (xs[0], table[0]["acc"]), textcoords="offset points", xytext=(4, -14), fontsize=8)
    train = [r for r in grpo if "critic/score/mean" in r]
    ax.plot([r["wall_s"] / 60 for r in train], [r["critic/score/mean"] for r in train], ".-", alpha=0.5,
            label="GRPO training reward (sampled)")  # fmt: skip
    sft_end = max((r["wall_s"] for r in sft), default=0.0) / 60
    ax.axvspan(0, sft_end, color="grey", alpha=0.12, label="SFT")
    ax.set_xlabel("wall time since SFT started (minutes; loading and validation included)")
    ax.set_ylim(-0.02, 1.05)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    losses = [r for r in sft if "train/loss" in r]
    loss_ax.plot([r["step"] for r in losses], [r["train/loss"] for r in losses], ".-")
    loss_ax.set_xlabel("SFT step")
    loss_ax.set_ylabel("SFT training loss")
    loss_ax.grid(alpha=0.3)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=110)
    plt.close(fig)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add = parser.add_argument
    add("--layers", type=int, default=2, help="language-model layers of the tiny VLM")
    add("--hidden", type=int, default=64, help="language-model width (a multiple of 16)")
    add("--kinds", default="colour", help="shapes question kinds (count,colour)")
    add("--train-size", type=int, default=512)
    add("--test-size", type=int, default=300)
    add("--sft-steps", type=int, default=120)
    add("--sft-batch", type=int, default=16)
    add("--sft-lr", type=float, default=5e-3)
    add("--grpo-steps", type=int, default=40)
    add("--grpo-lr", type=float, default=1e-3)
    add("--prompts", type=int, default=16, help="prompts per GRPO step")
    add("--n", type=int, default=8, help="samples per prompt")
    add("--response-length", type=int, default=8, help="new tokens at most")
    add("--test-freq", type=int, default=10)
    add("--seed", type=int, default=0)
    add("--threads", type=int, default=2)
    add("--set", action="append", default=[], metavar="KEY=VALUE", help="extra GRPO overrides")
    add("--out", default="/tmp/hybridflow-vlm-shapes")
    add("--png", default=str(REPO_ROOT / "docs" / "images" / "vlm_shapes.png"))
    return parser.parse_args(argv)


def print_report(table: list[dict], total_s: float, n_test: int) -> dict[str, Any]:
    print(f"\n| phase | step | wall (s) | held-out accuracy (n={n_test}) | s.e. |\n|---|---|---|---|---|")
    for r in table:
        print(f"| {r['phase']} | {r['step']} | {r['wall_s']:.0f} | {r['acc']:.3f} | {r['se']:.3f} |")
    start = next((r for r in table if r["phase"] == "sft"), None)
    grpo = [r for r in table if r["phase"] == "grpo"]
    if start is None or not grpo:
        print(f"\ntotal {total_s:.0f} s; no GRPO validation after the SFT checkpoint")
        return {}
    last = grpo[-1]
    gain = last["acc"] - start["acc"]
    se_gain = math.sqrt(start["se"] ** 2 + last["se"] ** 2)
    print(
        f"\nSFT checkpoint {start['acc']:.3f} → after {last['step']} GRPO steps {last['acc']:.3f}: "
        f"gain {gain:+.3f} ± {se_gain:.3f} (s.e. of the difference, {gain / se_gain if se_gain else float('nan'):.1f} s.e.); "
        f"total {total_s:.0f} s"
    )
    return {"sft_acc": start["acc"], "grpo_acc": last["acc"], "gain": gain, "gain_se": se_gain}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    out = Path(args.out)
    if out.exists():
        raise SystemExit(f"{out} exists: remove it or pick another --out")
    out.mkdir(parents=True)
    env = child_env(args.threads)
    machine = machine_facts()
    print(f"CPU: {machine['cpu']}, {args.threads} threads, fp32; load (1, 5, 15 min) {machine['loadavg']}")
    build_model(out / "base", args.layers, args.hidden, args.seed)
    subprocess.run(data_command(out / "task", args), check=True, env=env, cwd=REPO_ROOT, stdout=subprocess.DEVNULL)
    n_test = sum(1 for line in (out / "task" / "test.jsonl").read_text().splitlines() if line.strip())

    start = time.perf_counter()
    sft = run_stamped(
        sft_command(out / "base", out / "task", out / "sft", args), out / "sft", out / "sft.log", env, start
    )
    sft_hf = out / "sft" / f"global_step_{args.sft_steps}" / "hf"
    grpo = run_stamped(
        grpo_command(sft_hf, out / "task", out / "grpo", args), out / "grpo", out / "grpo.log", env, start
    )
    total_s = time.perf_counter() - start

    table = table_rows(sft, grpo, args.sft_steps, n_test)
    summary = print_report(table, total_s, n_test)
    write_json(out / "vlm_shapes.json", {"machine": machine, "args": vars(args), "n_test": n_test, "table": table,
                                         **summary, "sft_metrics": sft, "grpo_metrics": grpo})  # fmt: skip
    title = (
        f"tiny Qwen2-VL ({args.layers}×{args.hidden}) on shapes ({args.kinds}): {args.sft_steps} SFT steps, then "
        f"{args.grpo_steps} GRPO steps ({args.prompts} prompts × {args.n}); {machine['cpu']}, {args.threads} threads, fp32"
    )
    plot(Path(args.png), title, sft, grpo, table)
    print(f"wrote {out / 'vlm_shapes.json'} and {args.png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
