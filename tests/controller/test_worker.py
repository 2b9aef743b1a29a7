"""Worker base: rank info from the group's context or the environment; process-group helper."""

from __future__ import annotations

import pytest
import torch

from hybridflow.controller import RankInfo, Worker
from hybridflow.controller.worker import current_rank_info, rank_context


def test_rank_info_env_round_trip() -> None:
    info = RankInfo(rank=2, world_size=4, local_rank=0, local_world_size=2, master_addr="10.0.0.5", master_port=29511)
    env = info.env()
    assert env == {
        "RANK": "2",
        "WORLD_SIZE": "4",
        "LOCAL_RANK": "0",
        "LOCAL_WORLD_SIZE": "2",
        "MASTER_ADDR": "10.0.0.5",
        "MASTER_PORT": "29511",
    }
    assert RankInfo.from_env(env) == info


def test_rank_info_rejects_impossible_ranks() -> None:
    with pytest.raises(ValueError, match="rank=4, world_size=4"):
        RankInfo(rank=4, world_size=4)
    with pytest.raises(ValueError, match="bad rank environment"):
        RankInfo.from_env({"RANK": "one"})


def test_worker_takes_rank_from_context_else_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(key, raising=False)
    assert Worker().rank_info == RankInfo()
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "3")
    assert (Worker().rank, Worker().world_size) == (1, 3)
    with rank_context(RankInfo(rank=2, world_size=5, master_port=1234)):
        worker = Worker()
        assert current_rank_info().rank == 2
    assert (worker.rank, worker.world_size, worker.master_port) == (2, 5, 1234)
    assert current_rank_info().rank == 1  # the context is gone again


def test_dispatch_info_is_declared_by_the_worker() -> None:
    worker = Worker()
    with pytest.raises(ValueError, match="no dispatch info for mesh 'actor'.*set_dispatch_info"):
        worker.get_dispatch_info("actor")
    worker.set_dispatch_info("actor", dp_rank=3, is_collect=False)
    assert (worker.get_dispatch_info("actor").dp_rank, worker.get_dispatch_info("actor").is_collect) == (3, False)


def test_single_rank_process_group_on_cpu() -> None:
    import torch.distributed as dist

    with rank_context(RankInfo()):
        worker = Worker()
    assert worker.init_process_group() == "gloo"
    try:
        t = torch.tensor([3.0])
        dist.all_reduce(t)
        assert t.item() == 3.0 and dist.get_world_size() == 1
    finally:
        dist.destroy_process_group()
