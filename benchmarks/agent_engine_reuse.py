"""Agent-loop generate calls: a fresh engine per call (the old way) vs the rollout's one engine.

    python benchmarks/agent_engine_reuse.py                        # SmolLM2-135M-Instruct, 8 rows × 16 tokens
    python benchmarks/agent_engine_reuse.py --model tiny-llama --calls 3   # a quick smoke run

Both sides run the same batch through ``single_turn_agent`` on an ``InProcessClient``, greedily,
and must return the same tokens. **Before** builds a ``GenerationEngine`` for the call (a decoder
of its own, its packed weight copies built at the first prefill, a thread started and stopped),
as ``AgentLoopRollout`` did up to issue 35; that mode lives only here. **After** is
``AgentLoopRollout.generate_with_metrics``: the rollout's one engine, kept across calls, on the
rollout's own decoder, whose packed weights are rebuilt only when the weights change. The two
alternate ``--calls`` times (after a warm-up call each); the median per call is reported, with
the ratio before / after, in wall and in process CPU time. ``--out`` writes the JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing
sys.path.insert(0, str(Path(__file__).resolve().parent))  # the benchmarks' shared helpers
from common import cpu_kind, describe_machine, hardware_facts, machine_facts  # noqa: E402

QUESTIONS = (
    "What is 12 + 30?",
    "Name a colour of the sky.",
    "Spell the word cat backwards.",
    "How many legs does a spider have?",
    "What is the capital of France?",
    "Give one prime number above 10.",
    "What is 7 times 6?",
    "Which is larger, 9 or 11?",
)


def _prompts(tokenizer: Any, rows: int) -> Any:
    """``rows`` chat prompts, left-padded, as the RL dataset gives them."""
    import torch

    from hybridflow.agent.tokens import render_ids
    from hybridflow.data.rl_dataset import left_pad
    from hybridflow.protocol import DataProto

    ids = [
        render_ids(tokenizer, [{"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]}], add_generation_prompt=True)
        for i in range(rows)
    ]
    width = max(len(x) for x in ids)
    parts = [left_pad(x, width, tokenizer.pad_token_id or 0) for x in ids]
    names = ("input_ids", "attention_mask", "position_ids")
    tensors = {name: torch.stack([p[k] for p in parts]) for k, name in enumerate(names)}
    return DataProto.from_dict(tensors=tensors, meta_info={"seed": 0})


def _fresh_engine_call(rollout: Any, prompts: Any) -> Any:
    """One call the old way: a GenerationEngine built, started and shut down for this call."""
    from hybridflow.inference.client import InProcessClient
    from hybridflow.inference.generation_engine import GenerationEngine
    from hybridflow.workers.rollout.agent_loop import batch_seed
    from hybridflow.workers.rollout.torch_rollout import pad_token_id

    meta = dict(prompts.meta_info)
    params = rollout.sampling_params(meta)
    pad = pad_token_id(meta, rollout.default_pad)
    seed = batch_seed(meta, rollout.generator)
    engine = GenerationEngine(rollout.model, pad, dtype=rollout.decoder.dtype, max_rows=len(prompts), seed=seed)
    engine.start()
    try:
        client = InProcessClient(engine, stop_token_ids=params.stop_token_ids)
        width = prompts.batch["input_ids"].shape[1]
        return rollout.loops.run(prompts, client, params, seed=seed, pad=pad, prompt_length=width).data
    finally:
        engine.shutdown()


def _timed(call: Callable[[], Any]) -> tuple[float, float, Any]:
    wall, cpu = time.perf_counter(), time.process_time()
    out = call()
    return time.perf_counter() - wall, time.process_time() - cpu, out


def run(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    from hybridflow.config.actor_rollout_ref import RolloutConfig
    from hybridflow.models import load_model_and_tokenizer
    from hybridflow.models.sources import resolve_model_path
    from hybridflow.utils.precision import resolve_compute_dtype
    from hybridflow.workers.rollout.agent_loop import AgentLoopRollout

    torch.set_num_threads(args.threads)
    dtype = resolve_compute_dtype(args.dtype)
    model, tokenizer = load_model_and_tokenizer(str(resolve_model_path(args.model)), dtype="fp32")
    model.eval().requires_grad_(False)
    base = RolloutConfig()
    config = replace(base, response_length=args.new_tokens, do_sample=False, seed=0,
                     multi_turn=replace(base.multi_turn, enable=True))  # fmt: skip
    rollout = AgentLoopRollout(config, model, tokenizer, dtype=dtype)
    prompts = _prompts(tokenizer, args.rows)
    sides: dict[str, Callable[[], Any]] = {
        "before": lambda: _fresh_engine_call(rollout, prompts),
        "after": lambda: rollout.generate_with_metrics(prompts).data,
    }
    times: dict[str, list[tuple[float, float]]] = {side: [] for side in sides}
    outs: dict[str, Any] = {}
    for side, call in sides.items():  # warm-up: the first call of each side pays one-off costs
        outs[side] = call()
    for _ in range(args.calls):
        for side, call in sides.items():
            wall, cpu, outs[side] = _timed(call)
            times[side].append((wall, cpu))
    rollout.close()
    same = bool(torch.equal(outs["before"].batch["responses"], outs["after"].batch["responses"]))
    medians = {side: {"wall_s": statistics.median(w for w, _ in t), "cpu_s": statistics.median(c for _, c in t)}
               for side, t in times.items()}  # fmt: skip
    return {
        "model": args.model, "dtype": dtype, "rows": args.rows, "new_tokens": args.new_tokens, "calls": args.calls,
        "threads": args.threads, "same_tokens": same, "median_per_call": medians,
        "ratio_wall": medians["before"]["wall_s"] / medians["after"]["wall_s"],
        "ratio_cpu": medians["before"]["cpu_s"] / medians["after"]["cpu_s"],
        "engines_built_after": rollout.engines.engines_built,
    }  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--dtype", default="auto", help="auto | fp32 | bf16 (the sampler's compute dtype)")
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=16)
    parser.add_argument("--calls", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    machine = machine_facts()
    hardware = hardware_facts(args.dtype, 256, args.threads)
    result = {**run(args), "machine": machine, "cpu_kind": cpu_kind(machine, hardware)}
    for line in describe_machine(machine, hardware, args.threads):
        print(line)
    before, after = result["median_per_call"]["before"], result["median_per_call"]["after"]
    print(f"{result['cpu_kind']}; {args.model} ({result['dtype']}), {args.rows} rows × {args.new_tokens} tokens, "
          f"median of {args.calls} calls; load {machine['loadavg']}")  # fmt: skip
    print(f"  fresh engine per call : {before['wall_s']:.3f} s wall, {before['cpu_s']:.3f} s CPU")
    print(f"  the rollout's engine  : {after['wall_s']:.3f} s wall, {after['cpu_s']:.3f} s CPU")
    print(f"  ratio before / after  : {result['ratio_wall']:.2f}× wall, {result['ratio_cpu']:.2f}× CPU; "
          f"same tokens: {result['same_tokens']}; engines built by the rollout: {result['engines_built_after']}")  # fmt: skip
    if args.out is not None:
        args.out.write_text(json.dumps(result, indent=2))
    return 0 if result["same_tokens"] else 1


if __name__ == "__main__":
    sys.exit(main())
