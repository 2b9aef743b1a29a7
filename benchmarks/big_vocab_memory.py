"""Peak memory of one actor update with a large vocabulary: the LM head chunked vs whole.

    python benchmarks/big_vocab_memory.py                       # Gemma 3 270M (262k vocabulary)
    python benchmarks/big_vocab_memory.py --model smollm2-135m-instruct --rows 8

One update = one forward + backward of the actor's log-prob pass (``response_log_probs`` with
the entropy metric, as the actor runs it) over ``--rows`` rollouts of a 32-token prompt and a
``--response``-token response in a single micro-batch, a policy-gradient loss, and an AdamW
step. Each variant runs in a fresh child process: ``plain`` (the model's LM head makes the
logits of every response position, then the fused log-softmax) and ``chunked`` (the head
runs a chunk of rows at a time from the hidden states, :mod:`hybridflow.engine.chunked_lm_head`).
The child first runs one 1-row update (so gradients and AdamW state exist, as in every update
but the first), then resets the kernel's resident-set high-water mark (``/proc/self/clear_refs``),
runs the measured update and reads the mark back (``VmHWM``): the peak is what that update
added on top of the model, its gradients and optimizer state. CPU tensors only, float32.
Timings share the machine with whatever else runs on it: the memory numbers are the robust ones.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing
sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import describe_machine, machine_facts  # noqa: E402

VARIANTS = ("plain", "chunked")
MIB = 1024 * 1024


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def _batch(rows: int, response: int, vocab: int, seed: int):
    import torch
    from tensordict import TensorDict

    from hybridflow import fields as FK
    from hybridflow.engine.forward import compute_position_ids

    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(10, vocab, (rows, 32 + response), generator=g)
    mask = torch.ones_like(ids)
    return TensorDict(
        {
            FK.INPUT_IDS: ids,
            FK.ATTENTION_MASK: mask,
            FK.POSITION_IDS: compute_position_ids(mask),
            FK.RESPONSES: ids[:, 32:],
            FK.RESPONSE_MASK: mask[:, 32:],
            FK.ADVANTAGES: torch.randn(rows, response, generator=g),
        },
        batch_size=[rows],
    )


class PhasePeaks:
    """The resident-set peak of each phase above the steady state measured at ``start()``."""

    def __init__(self) -> None:
        self.base_kib = 0
        self.peaks_mib: dict[str, float] = {}

    def start(self) -> None:
        Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
        self.base_kib = _status_kib("VmRSS")

    def end_phase(self, name: str) -> None:
        self.peaks_mib[name] = (_status_kib("VmHWM") - self.base_kib) / 1024
        Path("/proc/self/clear_refs").write_text("5")


def _update(model, optimizer, batch, peaks: PhasePeaks | None = None) -> float:
    """One forward + backward + AdamW step; the seconds it took."""
    from hybridflow import fields as FK
    from hybridflow.engine.forward import response_log_probs

    mark = peaks.end_phase if peaks is not None else lambda name: None
    start = time.perf_counter()
    out = response_log_probs(model, batch, calculate_entropy=True, entropy_requires_grad=False)
    mask = batch[FK.RESPONSE_MASK]
    loss = -(batch[FK.ADVANTAGES] * out["log_probs"] * mask).sum() / mask.sum()
    mark("forward")
    loss.backward()
    mark("backward")
    optimizer.step()
    optimizer.zero_grad(set_to_none=False)  # gradients stay allocated, as between real updates
    mark("step")
    del out, loss
    return time.perf_counter() - start


def child(args: argparse.Namespace) -> None:
    """Run one variant and print its result as one JSON line."""
    import torch

    from hybridflow.engine import chunked_lm_head, forward
    from hybridflow.models import load_model_and_tokenizer

    # glibc's default allocator (no keep_freed_memory): freed blocks go back to the kernel, so
    # the resident set follows live tensors and memory freed by the warm-up is not reused unseen.
    torch.manual_seed(0)
    forward.CHUNKED_HEAD_MIN_BYTES = 0 if args.child == "chunked" else 1 << 62
    model, _ = load_model_and_tokenizer(args.model, dtype="fp32")
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6)
    config: Any = model.config
    vocab = int(config.vocab_size)
    _update(model, optimizer, _batch(1, args.response, vocab, seed=1))  # gradients + AdamW state exist now
    batch = _batch(args.rows, args.response, vocab, seed=0)
    peaks = PhasePeaks()
    peaks.start()
    before = peaks.base_kib
    seconds = _update(model, optimizer, batch, peaks)
    result = {
        "variant": args.child,
        "vocab": vocab,
        "rss_before_mib": before / 1024,
        "seconds": seconds,
        "chunk_mib": chunked_lm_head.CHUNK_BYTES / MIB,
        "peak_added_mib": max(peaks.peaks_mib.values()),
    }
    print(json.dumps(result | {f"{k}_mib": v for k, v in peaks.peaks_mib.items()}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="gemma3-270m")
    parser.add_argument("--rows", type=int, default=32)
    parser.add_argument("--response", type=int, default=64)
    parser.add_argument("--child", choices=VARIANTS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    import torch

    machine = machine_facts()
    hardware = {
        "dtype": "fp32",
        "dtype_requested": "fp32",
        "auto_decision": "n/a (fp32 forced)",
        "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "attn_implementation": "default",
    }
    print("\n".join(describe_machine(machine, hardware, torch.get_num_threads())))
    results = {}
    for variant in VARIANTS:
        sizes = ["--model", args.model, "--rows", str(args.rows), "--response", str(args.response)]
        done = subprocess.run(
            [sys.executable, __file__, "--child", variant, *sizes], check=True, capture_output=True, text=True
        )
        results[variant] = json.loads(done.stdout.strip().splitlines()[-1])
    _report(args, results)


def _report(args: argparse.Namespace, results: dict[str, dict[str, Any]]) -> None:
    plain, chunked = results["plain"], results["chunked"]
    logits_mib = args.rows * args.response * plain["vocab"] * 4 / MIB
    print(
        f"{args.model}, vocabulary {plain['vocab']}, {args.rows} rows × {args.response} response tokens in one "
        f"micro-batch, fp32: the float32 logits of the response positions are {logits_mib:.0f} MiB"
    )
    print(
        "| LM head | update peak above steady state, MiB | forward | backward | step phase | update s | RSS before, MiB |"
    )
    print("|---|---|---|---|---|---|---|")
    for name, r in results.items():
        phases = " | ".join(f"{r[k + '_mib']:.0f}" for k in ("forward", "backward", "step"))
        print(f"| {name} | {r['peak_added_mib']:.0f} | {phases} | {r['seconds']:.1f} | {r['rss_before_mib']:.0f} |")
    print(
        f"chunked / plain: peak **{chunked['peak_added_mib'] / plain['peak_added_mib']:.2f}×**, "
        f"time {chunked['seconds'] / plain['seconds']:.2f}× (one run each; the machine was shared)"
    )


if __name__ == "__main__":
    main()
