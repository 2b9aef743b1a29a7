"""Data-parallel ranks of the supervised trainers (``hybridflow sft``, ``hybridflow rm``) under torchrun
(or the Ray launcher, :mod:`hybridflow.trainer.supervised.ray_launch`, which sets the same variables).

``torchrun --nproc_per_node=N -m hybridflow.entrypoints.sft ...`` starts N copies of the entry
point with ``RANK``/``WORLD_SIZE``/``LOCAL_RANK``/``MASTER_ADDR``/``MASTER_PORT`` set. Each copy
joins the default process group here (gloo on the CPU, NCCL on a GPU), builds the same model
from the same seed, and the FSDP2 engine (:mod:`hybridflow.engine.fsdp`) shards it. Every rank
iterates the same loader (same seed, so the same global batches of ``data.train_batch_size``
rows) and trains on its own contiguous slice of each batch (:func:`rank_rows`); the loss
normalisers are summed over ranks (:func:`global_sum`), so the update equals the one-process
update on the whole batch (the contract of :mod:`hybridflow.algorithms.aggregation`).

Without the torchrun variables nothing here touches torch.distributed: :data:`ONE_PROCESS`.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.distributed as dist
from tensordict import TensorDict

from hybridflow.config.sft_rules import torchrun_world_size
from hybridflow.controller.worker import RankInfo
from hybridflow.utils.distributed import all_reduce_sum


@dataclass(frozen=True)
class DataParallel:
    """This process's place among the data-parallel ranks (``world_size`` 1: one process)."""

    rank: int = 0
    world_size: int = 1
    # True when launched by torchrun: the FSDP engine is used even for one rank, so every
    # checkpoint of a torchrun run is sharded and resumes into any number of ranks
    launched: bool = False

    @property
    def is_main(self) -> bool:
        """Rank 0: the one rank that writes logs, metrics, the progress bar and prints."""
        return self.rank == 0


ONE_PROCESS = DataParallel()


def init_data_parallel(device: str) -> tuple[DataParallel, str]:
    """Join torchrun's process group (if launched by it); returns ``(ranks, device)``.

    On ``cuda`` each rank takes the GPU of its ``LOCAL_RANK`` (torchrun: every GPU of the machine
    visible) or its only visible GPU (a Ray actor: ``CUDA_VISIBLE_DEVICES`` names one), and NCCL;
    on the CPU gloo. ``device`` comes back with the GPU index when one was picked.
    """
    if torchrun_world_size() is None:
        return ONE_PROCESS, device
    info = RankInfo.from_env(os.environ)
    backend = "gloo"
    if torch.device(device).type == "cuda":
        index = info.local_rank % max(torch.cuda.device_count(), 1)
        torch.cuda.set_device(index)
        device, backend = f"cuda:{index}", "nccl"
    if not dist.is_initialized():
        dist.init_process_group(backend=backend, init_method="env://", rank=info.rank, world_size=info.world_size)
    return DataParallel(rank=info.rank, world_size=info.world_size, launched=True), device


def close_data_parallel() -> None:
    """Leave the process group (a clean exit; torchrun reports a rank that fails instead)."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def rank_rows(batch: TensorDict, ranks: DataParallel) -> TensorDict:
    """This rank's contiguous ``1/world_size`` of a training batch (the config checks that
    ``data.train_batch_size`` divides evenly: every rank must run the same micro-batches)."""
    if ranks.world_size == 1:
        return batch
    rows = int(batch.batch_size[0])
    if rows % ranks.world_size:
        raise ValueError(
            f"a training batch of {rows} rows does not split evenly over {ranks.world_size} ranks; "
            "data.train_batch_size must be a multiple of the number of processes"
        )
    share = rows // ranks.world_size
    return batch[ranks.rank * share : (ranks.rank + 1) * share]


def padded_rank_rows(batch: TensorDict, ranks: DataParallel) -> tuple[TensorDict, int]:
    """This rank's slice of a validation batch and how many of its rows are real.

    A validation batch (the last one especially) need not split evenly, but every rank must run
    the same number of forward passes: each slice is padded to ``ceil(rows / world_size)`` with
    copies of the batch's first row, which the caller leaves out of its sums.
    """
    if ranks.world_size == 1:
        return batch, int(batch.batch_size[0])
    rows = int(batch.batch_size[0])
    share = -(-rows // ranks.world_size)
    start = min(ranks.rank * share, rows)
    stop = min(start + share, rows)
    mine = batch[start:stop]
    real = stop - start
    if real < share:
        filler = batch[torch.zeros(share - real, dtype=torch.long)]
        mine = TensorDict.cat([mine, filler]) if real else filler
    return mine, real


def global_sum(values: list[float]) -> list[float]:
    """Each value summed over all ranks (float64 all-reduce; one process: unchanged)."""
    if not values:
        return []
    total = all_reduce_sum(torch.tensor(values, dtype=torch.float64))
    return [float(v) for v in total]


def rank_label() -> str:
    """``" (rank 1 of 2)"`` in a process torchrun started among several, ``""`` otherwise: added
    to the program name of every error message, so a failure names the rank it happened on."""
    world = torchrun_world_size()
    if world is None or world == 1:
        return ""
    return f" (rank {RankInfo.from_env(os.environ).rank} of {world})"


@contextlib.contextmanager
def naming_the_rank(prog: str) -> Iterator[None]:
    """An exception leaving the block is announced with the rank first (``prog (rank 1 of 2):
    failed: ...``), then re-raised: torchrun then stops the other ranks, which are blocked in a
    collective with this one, and reports the failed rank's exit code."""
    try:
        yield
    except Exception as exc:
        label = rank_label()
        if label:
            print(f"{prog}{label}: failed: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        raise
