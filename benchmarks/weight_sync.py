"""Weight sync: how long each checkpoint-engine backend takes to move the policy to a rollout copy.

    python benchmarks/weight_sync.py [--model smollm2-135m-instruct] [--repeats 3] [--bucket-mb 512]

The actor is a ``TorchEngine`` over the fp32 model; the receiver is another copy in the
compute dtype the auto rule picks on this CPU (bf16 where it is native, else fp32). Each
backend moves ``iter_sync_weights()`` (tied embedding once) ``--repeats`` times; the median is
reported, with the ratio to the baseline measured in the same run:

* baseline — ``load_named_tensors``: one in-place ``copy_`` per tensor into the receiver, no
  checks, not atomic (what the rollout worker did before the weight-sync backends);
* inproc — bucketed: each tensor checked (name, shape, finite after the cast) and staged as a
  copy, then all swapped in (atomic): one more copy and a finiteness scan per tensor;
* disk — each bucket written as a safetensors file and renamed, then the folder checked
  (headers, every value finite) and loaded: the same copy plus a write and a read of the bytes;
* http — each bucket serialised to safetensors and posted to ``hybridflow serve``'s app
  (uvicorn in a thread of this process, so client and server share the same cores), then
  parsed, staged and swapped as inproc.

After every run the receiver's tensors are compared to the actor's (cast to the receiver's
dtype) bit for bit; a mismatch fails the benchmark. Every figure names the CPU it ran on.
"""

from __future__ import annotations

import argparse
import socket
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import describe_machine, hardware_facts, machine_facts  # noqa: E402
from hybridflow.engine import TorchEngine  # noqa: E402
from hybridflow.inference.generation_engine import GenerationEngine  # noqa: E402
from hybridflow.inference.weights import load_named_tensors  # noqa: E402
from hybridflow.models import load_model_and_tokenizer, parse_dtype  # noqa: E402
from hybridflow.weight_sync import ModuleTarget, build_weight_sync  # noqa: E402


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _check(receiver: torch.nn.Module, actor: TorchEngine) -> None:
    state = receiver.state_dict()
    for name, tensor in actor.iter_sync_weights():
        if not torch.equal(state[name], tensor.to(state[name].dtype)):
            raise SystemExit(f"FAIL: {name} differs after the transfer")


def _serve(model: torch.nn.Module, tokenizer) -> tuple[str, object]:
    """``hybridflow serve``'s app on ``model`` (control routes on) under uvicorn in a thread."""
    import uvicorn

    from hybridflow.server.app import build_app
    from hybridflow.server.state import ServerState
    from hybridflow.server.text import TextCodec

    engine = GenerationEngine(model, tokenizer.pad_token_id, owns_weights=True)
    state = ServerState(engine=engine, codec=TextCodec(tokenizer), model_name="bench", max_model_len=2048,
                        eos_token_ids=(tokenizer.eos_token_id,), control_routes=True,
                        max_weight_bucket_bytes=4 << 30)
    port = _free_port()
    server = uvicorn.Server(uvicorn.Config(build_app(state), host="127.0.0.1", port=port, log_level="warning"))
    threading.Thread(target=server.run, daemon=True).start()
    while not server.started:
        time.sleep(0.02)
    return f"http://127.0.0.1:{port}", server


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--bucket-mb", type=int, default=512)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    machine, hardware = machine_facts(), hardware_facts("auto", 256, args.threads)
    dtype = parse_dtype(hardware["dtype"])
    actor_model, tokenizer = load_model_and_tokenizer(args.model, dtype=torch.float32)
    actor = TorchEngine(actor_model, lr=1e-6)
    total = sum(t.numel() * t.element_size() for _, t in actor.iter_sync_weights())
    bucket = args.bucket_mb << 20

    def fresh() -> torch.nn.Module:
        model, _ = load_model_and_tokenizer(args.model, dtype=dtype)
        with torch.no_grad():  # start from other values, so every run really changes the receiver
            for p in model.parameters():
                p.mul_(0.5)
        return model.requires_grad_(False)

    receiver, served = fresh(), fresh()
    url, server = _serve(served, tokenizer)
    runs: dict[str, list[float]] = {}

    def timed(name: str, fn, check_module: torch.nn.Module) -> None:
        times = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
            _check(check_module, actor)
        runs[name] = times

    timed("baseline", lambda: load_named_tensors(receiver, actor.iter_sync_weights()), receiver)
    target = ModuleTarget(receiver)
    inproc = build_weight_sync("inproc", target, bucket)
    timed("inproc", lambda: inproc.sync(actor.iter_sync_weights(), 1), receiver)
    with tempfile.TemporaryDirectory() as tmp:
        disk = build_weight_sync("disk", target, bucket, dir=tmp)
        timed("disk", lambda: disk.sync(actor.iter_sync_weights(), 2), receiver)
    http = build_weight_sync("http", url, bucket)
    timed("http", lambda: http.sync(actor.iter_sync_weights(), 3), served)
    http.close()
    server.should_exit = True

    print("\n".join(describe_machine(machine, hardware, args.threads)))
    print(f"model {args.model}: {total / 2**20:.0f} MiB fp32 sent, receiver in {hardware['dtype']}, "
          f"buckets of {args.bucket_mb} MiB, {args.repeats} repeats (median)")
    base = statistics.median(runs["baseline"])
    print(f"{'backend':<10} {'seconds':>8} {'MiB/s':>8} {'× baseline':>11}")
    for name, times in runs.items():
        med = statistics.median(times)
        print(f"{name:<10} {med:8.3f} {total / 2**20 / med:8.0f} {med / base:11.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
