"""use_remove_padding: packed micro-batches vs padded ones, same rows, same model, same run.

    python benchmarks/packing.py                    # SmolLM2-135M, dtype auto, 16 rows of mixed lengths
    python benchmarks/packing.py --model tiny-llama --repeats 2

One forward + backward of the actor's log-prob pass (``response_log_probs``) over micro-batches
of ``--micro`` rows each: prompts of 30–60 tokens, responses of 4–64 tokens (uniform, seeded)
— the mixed lengths of an RL batch whose rows do not share prompts (PPO with n = 1, or the
critic). The padded side is the stock path: each micro-batch cut to its longest row (rows
sorted by length first, as the engine does); the packed side runs the same micro-batches as
one row each with attention inside every row. The two alternate ``--repeats`` times; the best
time of each is kept. Printed: the CPU and dtype decision, real vs computed tokens, seconds
per pass, the ratio, and the largest log-prob difference (float rounding only).
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from tensordict import TensorDict  # noqa: E402

from common import describe_machine, machine_facts  # noqa: E402
from hybridflow import fields as FK  # noqa: E402
from hybridflow.engine.forward import compute_position_ids, response_log_probs  # noqa: E402
from hybridflow.engine.micro_batch import MicroBatchSpec, plan_micro_batches  # noqa: E402
from hybridflow.models import choose_attn_implementation, load_model_and_tokenizer  # noqa: E402
from hybridflow.models.packed_attention import packed_name  # noqa: E402
from hybridflow.utils.precision import describe_compute_dtype, resolve_compute_dtype  # noqa: E402


def mixed_batch(rows: int, vocab: int, seed: int) -> TensorDict:
    g = torch.Generator().manual_seed(seed)
    prompt_width, response_width = 60, 64
    ids = torch.zeros(rows, prompt_width + response_width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i in range(rows):
        p = int(torch.randint(30, prompt_width + 1, (1,), generator=g))
        r = int(torch.randint(4, response_width + 1, (1,), generator=g))
        ids[i, prompt_width - p : prompt_width + r] = torch.randint(10, vocab, (p + r,), generator=g)
        mask[i, prompt_width - p : prompt_width + r] = 1
    return TensorDict({FK.INPUT_IDS: ids, FK.ATTENTION_MASK: mask, FK.POSITION_IDS: compute_position_ids(mask),
                       FK.RESPONSES: ids[:, prompt_width:]}, batch_size=[rows])


def one_pass(model: torch.nn.Module, batch: TensorDict, plan: list[list[int]], autocast: torch.dtype | None):
    model.zero_grad(set_to_none=True)
    start = time.perf_counter()
    outs = []
    for rows in plan:
        with torch.autocast("cpu", dtype=autocast or torch.bfloat16, enabled=autocast is not None):
            out = response_log_probs(model, batch[rows])["log_probs"]
        out.sum().backward()
        outs.append((rows, out.detach()))
    seconds = time.perf_counter() - start
    log_probs = torch.zeros(batch.batch_size[0], batch[FK.RESPONSES].shape[1])
    for rows, out in outs:
        log_probs[rows] = out
    return seconds, log_probs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--dtype", default="auto", choices=["auto", "fp32", "bf16"])
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--micro", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    machine = machine_facts()
    auto = describe_compute_dtype("auto")
    hardware = {"dtype": auto.dtype, "dtype_requested": args.dtype, "auto_decision": auto.line(),
                "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(), "attn_implementation": "n/a"}
    dtype = resolve_compute_dtype(args.dtype)
    hardware["dtype"] = dtype
    print("\n".join(describe_machine(machine, hardware, torch.get_num_threads())))
    base = choose_attn_implementation("auto", "cpu", 124)
    padded, _ = load_model_and_tokenizer(args.model, dtype="fp32", attn_implementation=base)
    packed = copy.deepcopy(padded)
    packed.config._attn_implementation = packed_name(base)
    for model in (padded, packed):
        model.train()
    batch = mixed_batch(args.rows, padded.config.vocab_size, args.seed)
    lengths = batch[FK.ATTENTION_MASK].sum(1).tolist()
    plan = plan_micro_batches(lengths, MicroBatchSpec(size=args.micro))
    real = int(sum(lengths))
    computed = sum(len(rows) * max(lengths[i] for i in rows) for rows in plan)
    autocast = torch.bfloat16 if dtype == "bf16" else None
    best = {"padded": float("inf"), "packed": float("inf")}
    results = {}
    one_pass(padded, batch, plan, autocast)  # warm-up
    for _ in range(args.repeats):
        for name, model in (("padded", padded), ("packed", packed)):
            seconds, log_probs = one_pass(model, batch, plan, autocast)
            best[name] = min(best[name], seconds)
            results[name] = log_probs
    diff = (results["packed"] - results["padded"]).abs().max().item()
    print(f"{args.rows} rows in micro-batches of {args.micro}, {dtype}, attention {base}: {real} real tokens, "
          f"~{computed} computed when padded (each micro-batch cut to its longest row)")
    print("| padded s | packed s | padded / packed | max log-prob diff |")
    print(f"| {best['padded']:.2f} | {best['packed']:.2f} | **{best['padded'] / best['packed']:.2f}×** | {diff:.1e} |")


if __name__ == "__main__":
    main()
