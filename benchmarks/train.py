"""Actor-update throughput and achieved FLOP/s against a matmul peak measured in the same run.

    python benchmarks/train.py                       # SmolLM2-135M, the dtype auto picks (after pip install -e .)
    python benchmarks/train.py --dtypes fp32,bf16    # both
    python benchmarks/train.py --model tiny-llama --dtypes fp32 --steps 2

For each dtype: the peak is the best of several square matmuls (``--matmul-size``) in that
dtype; then ``ActorWorker.update_actor`` runs on random rollout rows (one mini-batch, one
micro-batch, vanilla PPO loss), after one warm-up update. Reported per dtype:

* tokens/s over all real tokens (prompt + response) of the batch;
* achieved FLOP/s = 6·N·tokens / time (N = parameters, tied embeddings once) — the usual
  estimate — and the same with the LM head counted only on response tokens (what the actor
  computes: prompt positions never go through the 49k-row head), and both as % of the peak.

The header names the CPU, its flags, torch's CPU capability and the dtype decision; ``--out``
writes it all with the results as JSON. Target: the 6·N estimate ≥ 60% of the peak.

Baseline in the same run (``--no-hf`` skips it): a plain Hugging Face forward-backward on the same
rows — ``AutoModelForCausalLM`` from the same folder in the same dtype, logits of every position,
stock ``log_softmax`` + ``gather`` on the response tokens, loss = −mean(logp · advantage), backward,
``torch.optim.AdamW`` step. The actor does the same forward/backward/step plus its PPO loss
(ratio, clip, masked aggregation) and gradient clipping; its LM head runs on response positions only.
Not a test: timings on a shared 2-core machine vary ±30% between runs.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchmarks/common.py

from hybridflow import fields as FK
from hybridflow.config import load_config
from hybridflow.engine.forward import compute_position_ids
from hybridflow.protocol import DataProto
from hybridflow.utils.precision import resolve_compute_dtype
from hybridflow.workers.actor import ActorWorker

from common import describe_machine, machine_facts  # noqa: E402

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def matmul_peak(dtype: torch.dtype, size: int, repeats: int) -> float:
    """Best FLOP/s of ``size × size`` matmuls (2·size³ FLOPs each) over ``repeats`` timings."""
    a = torch.randn(size, size).to(dtype)
    b = torch.randn(size, size).to(dtype)
    torch.mm(a, b)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        torch.mm(a, b)
        best = min(best, time.perf_counter() - start)
    return 2 * size**3 / best


def random_rollout(rows: int, prompt_len: int, response_len: int, vocab: int, seed: int) -> DataProto:
    """Full-length prompts and responses (no padding), random tokens and advantages."""
    g = torch.Generator().manual_seed(seed)
    prompts = torch.randint(10, vocab, (rows, prompt_len), generator=g)
    responses = torch.randint(10, vocab, (rows, response_len), generator=g)
    attention = torch.ones(rows, prompt_len + response_len, dtype=torch.long)
    return DataProto.from_dict(
        tensors={
            FK.PROMPTS: prompts,
            FK.RESPONSES: responses,
            FK.INPUT_IDS: torch.cat([prompts, responses], dim=1),
            FK.ATTENTION_MASK: attention,
            FK.POSITION_IDS: compute_position_ids(attention),
            FK.RESPONSE_MASK: torch.ones(rows, response_len),
            FK.ADVANTAGES: torch.randn(rows, response_len, generator=g),
        }
    )


def build_actor(model: str, dtype: str, rows: int, micro: int, gradient_checkpointing: bool,
                extra: list[str] | None = None) -> ActorWorker:
    cfg = load_config(
        None,
        [
            f"actor_rollout_ref.model.path={model}",
            f"actor_rollout_ref.model.dtype={dtype}",
            f"actor_rollout_ref.model.enable_gradient_checkpointing={str(gradient_checkpointing).lower()}",
            # rows = prompts × n with n = 2 (the default estimator, grpo, needs groups)
            "actor_rollout_ref.rollout.n=2",
            f"data.train_batch_size={rows // 2}",
            f"actor_rollout_ref.actor.ppo_mini_batch_size={rows // 2}",
            f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={micro}",
            *(extra or []),
        ],
    )
    worker = ActorWorker(cfg.actor_rollout_ref, share_name=None)
    worker.init_model()
    return worker


def hf_update_seconds(args: argparse.Namespace, dtype: str, data: DataProto) -> float:
    """Seconds per plain HF forward-backward-step on ``data`` (after one warm-up step)."""
    from transformers import AutoModelForCausalLM

    from hybridflow.models import resolve_model_path

    model = AutoModelForCausalLM.from_pretrained(resolve_model_path(args.model), dtype=DTYPES[dtype])
    model.train()
    optim = torch.optim.AdamW(model.parameters(), lr=1e-6)
    ids, adv = data.batch[FK.INPUT_IDS], data.batch[FK.ADVANTAGES]
    response = data.batch[FK.RESPONSES]

    def step() -> None:
        for start in range(0, ids.shape[0], args.micro):
            rows = slice(start, start + args.micro)
            logits = model(ids[rows]).logits[:, -response.shape[1] - 1 : -1].float()
            logp = torch.log_softmax(logits, dim=-1).gather(-1, response[rows].unsqueeze(-1)).squeeze(-1)
            (-(logp * adv[rows]).mean()).backward()
        optim.step()
        optim.zero_grad(set_to_none=True)

    step()
    start = time.perf_counter()
    for _ in range(args.steps):
        step()
    return (time.perf_counter() - start) / args.steps


def flops_per_update(module: torch.nn.Module, rows: int, prompt_len: int, response_len: int) -> tuple[float, float]:
    """(6·N·tokens, the same with the LM head only on response tokens)."""
    n_params = sum(p.numel() for p in module.parameters())
    head = module.get_output_embeddings().weight.numel()
    tokens = rows * (prompt_len + response_len)
    return 6.0 * n_params * tokens, 6.0 * ((n_params - head) * tokens + head * rows * response_len)


def bench_dtype(args: argparse.Namespace, dtype: str) -> dict[str, float]:
    peak = matmul_peak(DTYPES[dtype], args.matmul_size, args.matmul_repeats)
    actor = build_actor(args.model, dtype, args.rows, args.micro, args.gradient_checkpointing, args.set)
    data = random_rollout(args.rows, args.prompt_len, args.response_len, actor.module.config.vocab_size, seed=0)
    actor.update_actor(data)  # warm-up (allocations, autotuning, first-step optimizer state)
    start = time.perf_counter()
    for _ in range(args.steps):
        actor.update_actor(data)
    seconds = (time.perf_counter() - start) / args.steps
    flops_6n, flops_model = flops_per_update(actor.module, args.rows, args.prompt_len, args.response_len)
    tokens = args.rows * (args.prompt_len + args.response_len)
    del actor
    hf = float("nan") if args.no_hf else hf_update_seconds(args, dtype, data)
    return {
        "hf_seconds": hf,
        "peak": peak,
        "seconds": seconds,
        "tokens_per_s": tokens / seconds,
        "flops_6n": flops_6n / seconds,
        "flops_model": flops_model / seconds,
    }


TARGET_FRACTION = 0.60


def machine_header(threads: int) -> tuple[dict, dict, list[str]]:
    """The machine facts, the dtype decision (as the benchmarks' parent processes report them)."""
    from hybridflow.models.attention import choose_attn_implementation
    from hybridflow.utils.precision import describe_compute_dtype

    machine = machine_facts()
    auto = describe_compute_dtype("auto")
    hardware = {"dtype": auto.dtype, "dtype_requested": "auto", "auto_decision": auto.line(), "dtype_warning": None,
                "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
                "attn_implementation": choose_attn_implementation("auto", "cpu", 128)}
    return machine, hardware, describe_machine(machine, hardware, threads)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--dtypes", default="auto", help="comma-separated: auto, fp32, bf16 (default auto)")
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--micro", type=int, default=8, help="rows per micro-batch")
    parser.add_argument("--prompt-len", type=int, default=64)
    parser.add_argument("--response-len", type=int, default=64)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--gradient-checkpointing", action="store_true")
    parser.add_argument("--no-hf", action="store_true", help="skip the plain HF forward-backward baseline")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="an extra config override for the actor (repeatable), e.g. "
                             "actor_rollout_ref.model.use_remove_padding=false")
    parser.add_argument("--matmul-size", type=int, default=2048)
    parser.add_argument("--matmul-repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=0, help="torch threads; 0 = torch's default")
    parser.add_argument("--out", default=None, help="write the machine facts and results here as JSON")
    args = parser.parse_args()
    if args.rows % 2:
        parser.error("--rows must be even (2 responses per prompt)")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    machine, hardware, header_lines = machine_header(torch.get_num_threads())
    print("\n".join(header_lines))
    print(f"model={args.model} rows={args.rows} micro={args.micro} tokens/row={args.prompt_len}+{args.response_len} "
          f"threads={torch.get_num_threads()} steps={args.steps}")
    header = (f"{'dtype':6} {'peak GFLOP/s':>13} {'s/update':>9} {'tok/s':>8} {'6N GFLOP/s':>11} {'%peak':>6} "
              f"{'model GFLOP/s':>14} {'%peak':>6} {'HF s/update':>12} {'HF/ours':>8}")
    print(header)
    results = {}
    for requested in args.dtypes.split(","):
        dtype = resolve_compute_dtype(requested.strip())
        r = bench_dtype(args, dtype)
        results[dtype] = r | {"requested": requested.strip(), "fraction_6n": r["flops_6n"] / r["peak"],
                              "fraction_model": r["flops_model"] / r["peak"]}
        print(
            f"{dtype:6} {r['peak'] / 1e9:13.1f} {r['seconds']:9.2f} {r['tokens_per_s']:8.0f} "
            f"{r['flops_6n'] / 1e9:11.1f} {100 * r['flops_6n'] / r['peak']:5.1f}% "
            f"{r['flops_model'] / 1e9:14.1f} {100 * r['flops_model'] / r['peak']:5.1f}% "
            f"{r['hf_seconds']:12.2f} {r['hf_seconds'] / r['seconds']:8.2f}",
            flush=True,
        )
    for dtype, r in results.items():
        met = "met" if r["fraction_6n"] >= TARGET_FRACTION else "not met"
        print(f"target: {dtype} update ≥ {TARGET_FRACTION:.0%} of the matmul peak (6N estimate): {r['fraction_6n']:.0%}, {met}")
    if args.out:
        Path(args.out).write_text(json.dumps({"machine": machine, "hardware": hardware, "threads": torch.get_num_threads(),
                                              "settings": vars(args), "results": results}, indent=2) + "\n")
        print(f"result: {args.out}")


if __name__ == "__main__":
    main()
