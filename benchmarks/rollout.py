"""Built-in torch sampler vs Hugging Face ``generate``, side by side, same prompts, same run.

    python benchmarks/rollout.py                       # SmolLM2-135M, fp32+bf16, batch 8+32, 64 tokens
    python benchmarks/rollout.py --dtypes bf16 --batches 32 --repeats 3
    python benchmarks/rollout.py --model tiny-llama --new-tokens 16   # quick smoke run

Both engines decode greedily (``--sample``: sample at temperature 1 from the full
distribution, as RL rollouts do) and produce exactly ``--new-tokens`` tokens per row (HF with
``min_new_tokens``, ours with ``ignore_eos``), so token counts are equal; tokens/s counts new
tokens over the whole call (prefill included). The two alternate ``--repeats`` times and the
best time of each is reported, which damps the noise of a shared machine; the load average is
printed with the results. The ratio is also given in process CPU time, which other jobs on the
machine disturb less than wall time. The last column compares the greedy tokens with HF's up
to each row's first EOS (expected identical in fp32; bf16 kernels round differently).
On a machine shared with other jobs, ``OMP_WAIT_POLICY=PASSIVE`` (set in the environment
before starting) stops idle OpenMP threads from spinning, which helps both engines.

Then the **decode roofline** of our sampler at each batch size: one decode step must stream the
weights (and read the KV cache) and do ``2·B·N`` FLOPs, so it cannot take less than
``max(bytes / memory bandwidth, FLOPs / matmul peak)``, both measured in the same run (read
bandwidth: the best of several sums over a 512 MiB buffer; peak: the best of several 2048²
matmuls in the dtype). The measured decode step is ``(T(n tokens) − T(1 token)) / (n − 1)``
(prefill cancels out); the fraction printed is roofline / measured (targets at batch 32: fp32 ≥ 75%,
bf16 ≥ 60%). It is followed by the step's matmul floor: every projection of the step run alone
on as many rows, weights streamed as in decode; the step's excess over it is everything else.
``--dtypes auto`` (the default) runs the dtype hybridflow's auto rule picks on this CPU; the
header names the CPU, its flags and that decision, and ``--out`` writes everything as JSON.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from dataclasses import replace
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

import torch  # noqa: E402

from hybridflow.config.actor_rollout_ref import RolloutConfig  # noqa: E402
from hybridflow.models import load_model_and_tokenizer  # noqa: E402
from hybridflow.protocol import DataProto  # noqa: E402
from hybridflow.utils.precision import describe_compute_dtype, resolve_compute_dtype  # noqa: E402
from hybridflow.workers.rollout import TorchRollout  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchmarks/common.py
from common import describe_machine, machine_facts  # noqa: E402

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
ROOFLINE_TARGETS = {"fp32": 0.75, "bf16": 0.60}  # issue 35: decode at batch 32, % of its roofline


def build_prompts(tokenizer, batch: int) -> dict[str, torch.Tensor]:
    """``batch`` distinct arithmetic questions, left-padded: chat-formatted, or for a base model
    without a chat template (Gemma 3 270M) plain ``Question: ...\nAnswer:`` text after its BOS."""
    texts = []
    plain = tokenizer.chat_template is None
    for i in range(batch):
        question = f"What is {17 + 7 * i} + {29 + 5 * i}? Explain step by step."
        if plain:
            texts.append(f"Question: {question}\nAnswer:")
        else:
            messages = [{"role": "user", "content": question}]
            texts.append(tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True))
    tokenizer.padding_side = "left"
    enc = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=plain)
    mask = enc["attention_mask"]
    return {
        "input_ids": enc["input_ids"],
        "attention_mask": mask,
        "position_ids": (mask.cumsum(-1) - 1).clamp(min=0),
    }


class Clock:
    """Wall time and this process's CPU time of a block (CPU time is less disturbed by other jobs)."""

    def __enter__(self) -> Clock:
        self.wall, self.cpu = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc: object) -> None:
        self.wall, self.cpu = time.perf_counter() - self.wall, time.process_time() - self.cpu


def time_hf(
    model, prompts: dict[str, torch.Tensor], new_tokens: int, pad_id: int, sample: bool
) -> tuple[Clock, torch.Tensor]:
    with Clock() as clock, torch.inference_mode():
        out = model.generate(
            input_ids=prompts["input_ids"],
            attention_mask=prompts["attention_mask"],
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            do_sample=sample,
            temperature=1.0 if sample else None,
            top_k=None,
            top_p=None,
            pad_token_id=pad_id,
        )
    return clock, out[:, prompts["input_ids"].shape[1] :]


def time_ours(rollout: TorchRollout, prompts: dict[str, torch.Tensor]) -> tuple[Clock, torch.Tensor]:
    data = DataProto.from_dict(tensors=prompts)
    with Clock() as clock:
        out = rollout.generate_sequences(data)
    return clock, out.batch["responses"]


def compare_greedy(hf_tokens: torch.Tensor, ours: torch.Tensor, eos_id: int) -> str:
    """Compare up to each row's first EOS: past it HF (``min_new_tokens``) suppresses EOS while
    ours (``ignore_eos``) keeps it, so the continuations legitimately differ."""
    is_eos = ours == eos_id
    before_eos = (is_eos.cumsum(dim=1) - is_eos.long()) == 0
    before_eos &= ~is_eos
    differ = ((hf_tokens != ours) & before_eos).any(dim=1)
    return "identical" if not bool(differ.any()) else f"{int(differ.sum())} rows differ"


def bench_config(args: argparse.Namespace, response_length: int) -> RolloutConfig:
    """The rollout settings both measurements use: every response exactly ``response_length`` tokens."""
    return replace(RolloutConfig(), response_length=response_length, do_sample=args.sample, temperature=1.0,
                   top_k=-1, top_p=1.0, ignore_eos=True, seed=0)


def run_case(args: argparse.Namespace, dtype: str, batch: int) -> dict:
    model, tokenizer = load_model_and_tokenizer(args.model, dtype=dtype)
    model.generation_config.temperature = None  # silence "do_sample=False with temperature" warnings
    model.generation_config.top_p = None
    model.generation_config.top_k = None
    prompts = build_prompts(tokenizer, batch)
    rollout = TorchRollout(bench_config(args, args.new_tokens), model, tokenizer, weight_format=args.weight_format)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    time_ours(rollout, {k: v[:2] for k, v in prompts.items()})  # warm-up: packing, first-call costs
    hf = [math.inf, math.inf]  # best wall, best CPU seconds
    ours = [math.inf, math.inf]
    for _ in range(args.repeats):
        clock, hf_tokens = time_hf(model, prompts, args.new_tokens, pad_id, args.sample)
        hf = [min(hf[0], clock.wall), min(hf[1], clock.cpu)]
        clock, ours_tokens = time_ours(rollout, prompts)
        ours = [min(ours[0], clock.wall), min(ours[1], clock.cpu)]
    new = batch * args.new_tokens
    same = "n/a (sampled)" if args.sample else compare_greedy(hf_tokens, ours_tokens, tokenizer.eos_token_id)
    print(
        f"| {dtype} | {batch} | {prompts['input_ids'].shape[1]} | {args.new_tokens} | "
        f"{new / hf[0]:.1f} | {new / ours[0]:.1f} | **{hf[0] / ours[0]:.2f}x** | "
        f"{hf[1] / ours[1]:.2f}x | {same} |",
        flush=True,
    )
    return {
        "dtype": dtype,
        "batch": batch,
        "prompt_len": prompts["input_ids"].shape[1],
        "new_tokens": args.new_tokens,
        "hf_tokens_per_s": new / hf[0],
        "ours_tokens_per_s": new / ours[0],
        "ratio_wall": hf[0] / ours[0],
        "ratio_cpu": hf[1] / ours[1],
        "greedy_vs_hf": same,
    }


def read_bandwidth(mib: int = 512, repeats: int = 5) -> float:
    """Best read bandwidth (bytes/s) of a sum over a buffer far larger than the caches."""
    buf = torch.ones(mib * 1024 * 1024 // 4, dtype=torch.float32)
    buf.sum()
    best = math.inf
    for _ in range(repeats):
        start = time.perf_counter()
        buf.sum()
        best = min(best, time.perf_counter() - start)
    return buf.numel() * 4 / best


def matmul_peak(dtype: torch.dtype, size: int = 2048, repeats: int = 5) -> float:
    a, b = torch.randn(size, size).to(dtype), torch.randn(size, size).to(dtype)
    a @ b
    best = math.inf
    for _ in range(repeats):
        start = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - start)
    return 2 * size**3 / best


def decode_work(model, dtype: torch.dtype, batch: int, context: int) -> tuple[float, float]:
    """(bytes, FLOPs) of one decode step at ``batch`` rows and ``context`` cached positions:
    every matrix of the decoder and the LM head read once, the KV cache read once."""
    cfg = model.config
    itemsize = torch.empty(0, dtype=dtype).element_size()
    layers = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    matrix_params = sum(m.weight.numel() for m in layers)  # includes the (tied) LM head
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    kv = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * head_dim * context * batch
    attention_flops = 4 * cfg.num_hidden_layers * cfg.num_attention_heads * head_dim * context * batch
    return (matrix_params + kv) * itemsize, 2 * batch * matrix_params + attention_flops


def matmuls_alone(decoder, batch: int, repeats: int) -> float | None:
    """Best seconds to run every projection of one decode step once on ``batch`` random rows, in
    decode order (q/k/v, o, gate, up, down per layer, then the LM head), as the step streams
    them: the step's matmul floor on this machine, weights as cold as in decode. The decode
    step's excess over it is everything else (attention, norms, RoPE, sampling, the loop).
    None for a decoder without projections (the HF path)."""
    if not hasattr(decoder, "projections"):
        return None
    decoder.refresh_weights()
    projections = decoder.projections()
    inputs = [torch.randn(batch, p.linears[0].in_features, dtype=decoder.dtype) for p in projections]
    best = math.inf
    with torch.inference_mode():
        for _ in range(repeats + 1):  # the first run warms the allocator
            start = time.perf_counter()
            for projection, x in zip(projections, inputs):
                projection(x)
            best = min(best, time.perf_counter() - start)
    return best


def roofline_case(args: argparse.Namespace, dtype: str, batch: int, bandwidth: float, peak: float) -> dict:
    """Measured decode step of our sampler against its roofline (see the module docstring)."""
    model, tokenizer = load_model_and_tokenizer(args.model, dtype=dtype)
    prompts = build_prompts(tokenizer, batch)
    timings = {}
    for steps in (1, args.new_tokens):
        rollout = TorchRollout(bench_config(args, steps), model, tokenizer, weight_format=args.weight_format)
        time_ours(rollout, prompts)  # warm-up: packing, allocation
        timings[steps] = min(time_ours(rollout, prompts)[0].wall for _ in range(args.repeats))
    step_s = (timings[args.new_tokens] - timings[1]) / (args.new_tokens - 1)
    context = prompts["input_ids"].shape[1] + args.new_tokens // 2  # mean cached positions over the decode
    nbytes, flops = decode_work(model, DTYPES[dtype], batch, context)
    bound_s = max(nbytes / bandwidth, flops / peak)
    fraction = bound_s / step_s
    matmul_s = matmuls_alone(rollout.decoder, batch, args.repeats)
    print(
        f"| {dtype} | {batch} | {1e3 * step_s:.1f} | {nbytes / 1e6:.0f} MB → {1e3 * nbytes / bandwidth:.1f} | "
        f"{flops / 1e9:.2f} GFLOP → {1e3 * flops / peak:.1f} | {1e3 * bound_s:.1f} | **{fraction:.0%}** |",
        flush=True,
    )
    if matmul_s is not None:
        matmul_flops = 2 * batch * sum(p.out_features * p.linears[0].in_features for p in rollout.decoder.projections())
        print(
            f"  matmuls alone (batch {batch}): {1e3 * matmul_s:.1f} ms = {matmul_s / step_s:.0%} of the step, "
            f"{matmul_flops / matmul_s / 1e9:.0f} GFLOP/s = {matmul_flops / matmul_s / peak:.0%} of the matmul peak; "
            f"load average {os.getloadavg()}",
            flush=True,
        )
    return {
        "dtype": dtype,
        "batch": batch,
        "decode_step_s": step_s,
        "bytes": nbytes,
        "flops": flops,
        "stream_s": nbytes / bandwidth,
        "compute_s": flops / peak,
        "roofline_s": bound_s,
        "fraction": fraction,
        "matmuls_alone_s": matmul_s,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m-instruct", help="model name or HF folder")
    parser.add_argument("--dtypes", nargs="+", default=["auto"], choices=["auto", "fp32", "bf16"])
    parser.add_argument("--batches", nargs="+", type=int, default=[8, 32])
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=2, help="alternating runs per engine; best kept")
    parser.add_argument("--weight-format", default="auto", choices=["auto", "shared", "packed"])
    parser.add_argument("--sample", action="store_true", help="sample at temperature 1 (as in RL) instead of greedy")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch's default)")
    parser.add_argument("--skip-hf", action="store_true", help="only the roofline part")
    parser.add_argument("--out", default=None, help="write the machine facts and results here as JSON")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.new_tokens < 2:
        parser.error("--new-tokens must be at least 2 (the decode step is measured between 1 and n tokens)")
    machine = machine_facts()
    auto = describe_compute_dtype("auto")
    hardware = {
        "dtype": auto.dtype,
        "dtype_requested": "auto",
        "auto_decision": auto.line(),
        "dtype_warning": None,
        "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "attn_implementation": "n/a",
    }
    print("\n".join(describe_machine(machine, hardware, torch.get_num_threads())))
    policy = os.environ.get("OMP_WAIT_POLICY", "default")
    print(f"torch {torch.__version__}, OMP_WAIT_POLICY={policy}, load average {os.getloadavg()}")
    dtypes = list(dict.fromkeys(resolve_compute_dtype(d) for d in args.dtypes))
    comparison = []
    if not args.skip_hf:
        print(
            "| dtype | batch | prompt len | new tokens | HF generate tok/s | torch sampler tok/s | ratio (wall) "
            "| ratio (CPU time) | greedy tokens vs HF |"
        )
        print("|---|---|---|---|---|---|---|---|---|")
        comparison = [run_case(args, dtype, batch) for dtype in dtypes for batch in args.batches]
        print(f"mode: {'sampling, temperature 1' if args.sample else 'greedy'}; load average {os.getloadavg()}")
    bandwidth = read_bandwidth()
    peaks = {dtype: matmul_peak(DTYPES[dtype]) for dtype in dtypes}
    print(
        f"read bandwidth {bandwidth / 1e9:.1f} GB/s; matmul peak "
        + ", ".join(f"{d} {p / 1e9:.0f} GFLOP/s" for d, p in peaks.items())
    )
    print(
        "| dtype | batch | decode step ms | bytes → stream ms | FLOPs → compute ms | roofline ms | roofline / measured |"
    )
    print("|---|---|---|---|---|---|---|")
    roofline = [roofline_case(args, d, b, bandwidth, peaks[d]) for d in dtypes for b in args.batches]
    for r in roofline:
        if r["batch"] == 32:
            target = ROOFLINE_TARGETS[r["dtype"]]
            met = "met" if r["fraction"] >= target else "not met"
            print(f"target: {r['dtype']} decode at batch 32 ≥ {target:.0%} of its roofline: {r['fraction']:.0%}, {met}")
    if args.out:
        Path(args.out).write_text(
            json.dumps(
                {
                    "machine": machine,
                    "hardware": hardware,
                    "threads": torch.get_num_threads(),
                    "settings": vars(args),
                    "read_bandwidth": bandwidth,
                    "matmul_peak": peaks,
                    "comparison": comparison,
                    "roofline": roofline,
                },
                indent=2,
            )
            + "\n"
        )
        print(f"result: {args.out}")


if __name__ == "__main__":
    main()
