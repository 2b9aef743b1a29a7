"""Worker classes for the controller tests (a module, so Ray actors can import them by path)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable

import numpy as np
import torch

from hybridflow.controller import Dispatch, Execute, Worker, make_nd_compute_dataproto_dispatch_fn, register
from hybridflow.protocol import DataProto

MESH = "toy_mesh"


class ToyWorker(Worker):
    """Adds rank-dependent values so every test can tell which rank computed what.

    ``tp_size`` > 1 declares a mesh where ranks r and r+1 (r even) are tensor-parallel peers:
    dp_rank = rank // tp_size, and only the first peer's output is collected.
    """

    def __init__(self, offset: float = 0.0, tp_size: int = 1) -> None:
        super().__init__()
        self.offset = offset
        self.set_dispatch_info(MESH, dp_rank=self.rank // tp_size, is_collect=self.rank % tp_size == 0)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def whoami(self) -> dict[str, object]:
        return {
            "rank": self.rank,
            "world_size": self.world_size,
            "local_rank": self.local_rank,
            "pid": os.getpid(),
            "master": f"{self.master_addr}:{self.master_port}",
            "env_rank": os.environ.get("RANK"),
        }

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def add_rank(self, x: float) -> float:
        return x + 10 * self.rank + self.offset

    @register(dispatch_mode=Dispatch.ALL_TO_ALL)
    def echo(self, x: object) -> tuple[int, object]:
        return (self.rank, x)

    @register(dispatch_mode=Dispatch.RANK_ZERO)
    def rank_zero_only(self) -> int:
        return 1000 + self.rank

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, execute_mode=Execute.RANK_ZERO)
    def executed_on_rank_zero(self) -> int:
        return self.rank

    @register(dispatch_mode=Dispatch.DP_COMPUTE)
    def scale(self, x: float) -> float:
        return x * (self.rank + 1)

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def add_rank_proto(self, data: DataProto) -> DataProto:
        """y = x + 100·rank; ``who`` records the rank of each row."""
        y = data.batch["x"] + 100 * self.rank
        return DataProto.from_dict({"y": y}, {"who": np.full(len(data), self.rank)})

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO, blocking=False)
    def double_later(self, data: DataProto) -> DataProto:
        return DataProto.from_dict({"x": data.batch["x"] * 2})

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO_WITH_FUNC)
    def apply(self, fn: Callable[[torch.Tensor], torch.Tensor], data: DataProto) -> DataProto:
        return DataProto.from_dict({"y": fn(data.batch["x"])})

    @register(dispatch_mode=Dispatch.DP_COMPUTE_METRIC)
    def metrics(self, data: DataProto) -> dict[str, float]:
        return {"rank": self.rank, "rows": len(data), "sum": float(data.batch["x"].sum())}

    @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn(MESH))
    def mesh_add(self, data: DataProto) -> DataProto:
        return DataProto.from_dict({"y": data.batch["x"] + 1000 * self.rank})

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def all_reduce_ranks(self) -> float:
        """Joins the group's torch.distributed process group (needs one process per rank)."""
        import torch.distributed as dist

        self.init_process_group()
        total = torch.tensor([float(self.rank + 1)])
        dist.all_reduce(total)
        return float(total.item())

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def fail_on(self, bad_rank: int) -> int:
        if self.rank == bad_rank:
            raise ValueError(f"boom on rank {self.rank}")
        return self.rank

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def sleep_for(self, seconds: float) -> int:
        time.sleep(seconds)
        return self.rank


class CounterWorker(Worker):
    """A second role for colocation tests: keeps state across calls."""

    def __init__(self, start: int = 0) -> None:
        super().__init__()
        self.count = start

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def pid(self) -> int:
        return os.getpid()

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def bump(self, by: int) -> int:
        self.count += by + self.rank
        return self.count
