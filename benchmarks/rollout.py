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
"""

from __future__ import annotations

import argparse
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
from hybridflow.workers.rollout import TorchRollout  # noqa: E402


def build_prompts(tokenizer, batch: int) -> dict[str, torch.Tensor]:
    """``batch`` distinct chat-formatted arithmetic questions, left-padded."""
    texts = []
    for i in range(batch):
        messages = [{"role": "user", "content": f"What is {17 + 7 * i} + {29 + 5 * i}? Explain step by step."}]
        texts.append(tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True))
    tokenizer.padding_side = "left"
    enc = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
    mask = enc["attention_mask"]
    return {
        "input_ids": enc["input_ids"],
        "attention_mask": mask,
        "position_ids": (mask.cumsum(-1) - 1).clamp(min=0),
    }


class Clock:
    """Wall time and this process's CPU time of a block (CPU time is less disturbed by other jobs)."""

    def __enter__(self) -> "Clock":
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


def run_case(args: argparse.Namespace, dtype: str, batch: int) -> None:
    model, tokenizer = load_model_and_tokenizer(args.model, dtype=dtype)
    model.generation_config.temperature = None  # silence "do_sample=False with temperature" warnings
    model.generation_config.top_p = None
    model.generation_config.top_k = None
    prompts = build_prompts(tokenizer, batch)
    config = replace(
        RolloutConfig(), response_length=args.new_tokens, do_sample=args.sample, temperature=1.0,
        top_k=-1, top_p=1.0, ignore_eos=True, seed=0
    )
    rollout = TorchRollout(config, model, tokenizer, weight_format=args.weight_format)
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m-instruct", help="model name or HF folder")
    parser.add_argument("--dtypes", nargs="+", default=["fp32", "bf16"], choices=["fp32", "bf16"])
    parser.add_argument("--batches", nargs="+", type=int, default=[8, 32])
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=2, help="alternating runs per engine; best kept")
    parser.add_argument("--weight-format", default="auto", choices=["auto", "shared", "packed"])
    parser.add_argument("--sample", action="store_true", help="sample at temperature 1 (as in RL) instead of greedy")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch's default)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    policy = os.environ.get("OMP_WAIT_POLICY", "default")
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, OMP_WAIT_POLICY={policy}, "
        f"load average {os.getloadavg()}"
    )
    print(
        "| dtype | batch | prompt len | new tokens | HF generate tok/s | torch sampler tok/s | ratio (wall) "
        "| ratio (CPU time) | greedy tokens vs HF |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for dtype in args.dtypes:
        for batch in args.batches:
            run_case(args, dtype, batch)
    print(f"mode: {'sampling, temperature 1' if args.sample else 'greedy'}; load average at the end {os.getloadavg()}")


if __name__ == "__main__":
    main()
