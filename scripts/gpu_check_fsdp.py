"""GPU check helper (run by scripts/gpu_check.sh under torchrun): NCCL collectives and the FSDP2
engine on CUDA against the single-process torch engine.

    python3 -m torch.distributed.run --standalone --nproc_per_node=N scripts/gpu_check_fsdp.py OUT_DIR

On every rank: an all-reduce and a broadcast over NCCL; then the tiny model trained 3 steps in
fp32 (TF32 off) by the FSDP engine over all ranks, each rank holding 1/N of the batch, while
rank 0 also trains a plain copy with the torch engine on the whole batch; the weights must
agree within 1e-4. A sharded checkpoint is written, reloaded, and its weights compared; then
a bf16 step checks the mixed-precision policy. Rank 0 prints one ``RESULT fsdp ...`` line.
``GPU_CHECK_ON_CPU=1`` runs the same logic with gloo on the CPU (to test this script itself).
"""

from __future__ import annotations

import os
import sys
import time
from functools import partial
from pathlib import Path

import torch
import torch.distributed as dist

from hybridflow import fields as FK
from hybridflow.algorithms.aggregation import agg_loss
from hybridflow.engine import FSDPEngine, MicroBatchSpec, TorchEngine
from hybridflow.engine.forward import response_log_probs
from hybridflow.models.tiny import build_tiny_model
from hybridflow.utils.distributed import all_reduce_sum


def synthetic_batch(rows: int, prompt_len: int = 16, response_len: int = 16, seed: int = 0):
    from tensordict import TensorDict

    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(4, 500, (rows, prompt_len + response_len), generator=g)
    lengths = torch.randint(1, response_len + 1, (rows,), generator=g)
    response_mask = (torch.arange(response_len)[None] < lengths[:, None]).float()
    attention = torch.cat([torch.ones(rows, prompt_len), response_mask], dim=1).long()
    return TensorDict(
        {
            FK.INPUT_IDS: ids,
            FK.ATTENTION_MASK: attention,
            FK.POSITION_IDS: (attention.cumsum(-1) - 1).clamp(min=0),
            FK.RESPONSES: ids[:, prompt_len:],
            FK.RESPONSE_MASK: response_mask,
            FK.ADVANTAGES: torch.randn(rows, response_len, generator=g) * response_mask,
        },
        batch_size=[rows],
    )


def pg_loss(global_tokens: torch.Tensor, dp_size: int, outputs, micro):
    mask = micro[FK.RESPONSE_MASK]
    loss = agg_loss(
        -micro[FK.ADVANTAGES] * outputs["log_probs"], mask, "token-mean",
        dp_size=dp_size, batch_num_tokens=global_tokens.to(mask.device),
    )
    return loss, {}


def train(engine, batch, dp_size: int, steps: int) -> list[float]:
    tokens = all_reduce_sum(batch[FK.RESPONSE_MASK].sum()) if dp_size > 1 else batch[FK.RESPONSE_MASK].sum()
    norms = []
    for _ in range(steps):
        engine.forward_backward(batch, response_log_probs, partial(pg_loss, tokens, dp_size), MicroBatchSpec(size=4))
        norms.append(engine.optimizer_step().grad_norm)
    return norms


def main(out_dir: str) -> int:
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if os.environ.get("GPU_CHECK_ON_CPU") == "1":
        dist.init_process_group("gloo")
        device = torch.device("cpu")
    else:
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
        dist.init_process_group("nccl")
        device = torch.device("cuda", torch.cuda.current_device())
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False

    t = torch.ones(4, device=device) * (rank + 1)
    dist.all_reduce(t)
    assert float(t[0]) == world * (world + 1) / 2, f"all_reduce gave {t.tolist()}"
    b = torch.tensor([rank], device=device)
    dist.broadcast(b, src=0)
    assert int(b) == 0

    rows = 8 * world
    full = synthetic_batch(rows)
    mine = full[rank * 8 : (rank + 1) * 8]
    fsdp = FSDPEngine(build_tiny_model(seed=0), lr=1e-3, device=device, grad_clip=1.0)
    t0 = time.perf_counter()
    fsdp_norms = train(fsdp, mine, world, 3)
    fsdp_s = time.perf_counter() - t0
    weights = {n: w.float().cpu() for n, w in fsdp.iter_sync_weights()}

    ckpt = Path(out_dir) / "fsdp_ckpt"
    fsdp.save_checkpoint(ckpt)
    fsdp.load_checkpoint(ckpt)
    reloaded = {n: w.float().cpu() for n, w in fsdp.iter_sync_weights()}
    ckpt_ok = all(torch.equal(reloaded[n], w) for n, w in weights.items())

    bf16 = FSDPEngine(build_tiny_model(seed=0), lr=1e-3, device=device, autocast_dtype=torch.bfloat16)
    bf16_norm = train(bf16, mine, world, 1)[0]

    status = 0
    if rank == 0:
        plain = TorchEngine(build_tiny_model(seed=0), lr=1e-3, device=device, grad_clip=1.0)
        plain_norms = train(plain, full, 1, 3)
        expected = {n: w.float().cpu() for n, w in plain.iter_sync_weights()}
        diff = max(float((weights[n] - w).abs().max()) for n, w in expected.items())
        norm_diff = max(abs(a - b) for a, b in zip(fsdp_norms, plain_norms))
        ok = diff < 1e-4 and norm_diff < 1e-3 and ckpt_ok and bf16_norm == bf16_norm
        status = 0 if ok else 1
        print(
            f"RESULT fsdp {'OK' if ok else 'FAIL'} world_size={world} backend={dist.get_backend()} "
            f"max_weight_diff_vs_torch_engine={diff:.2e} max_grad_norm_diff={norm_diff:.2e} "
            f"checkpoint_round_trip={'ok' if ckpt_ok else 'MISMATCH'} bf16_grad_norm={bf16_norm:.4f} "
            f"fsdp_3_steps_s={fsdp_s:.2f}",
            flush=True,
        )
    dist.barrier()
    dist.destroy_process_group()
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
