"""The in-process backend: every rank is an object in the controller's process.

This is the embedded default (world size 1 for real work: one process cannot host two
torch.distributed ranks). More ranks are allowed for dispatch logic and tests. Calls run
synchronously, rank by rank; a "non-blocking" call is already done when its
``DataProtoFuture`` is returned.
"""

from __future__ import annotations

from typing import Any, TypeVar

from hybridflow.controller.colocate import ColocatedWorker, colocated_role_classes
from hybridflow.controller.errors import WorkerError
from hybridflow.controller.host import HostInfo, RankHost
from hybridflow.controller.resource_pool import ClassWithInitArgs, ResourcePool
from hybridflow.controller.worker import RankInfo, find_free_port
from hybridflow.controller.worker_group import PerRank, WorkerGroup, describe_exception

__all__ = ["LocalBackend", "LocalWorkerGroup"]

W = TypeVar("W")


class LocalBackend:
    """Ranks as :class:`RankHost` objects in this process."""

    def __init__(self, resource_pool: ResourcePool, spec: ClassWithInitArgs[Any]) -> None:
        port = find_free_port()
        self._hosts: list[RankHost] = []
        self._infos: list[HostInfo] = []
        for rank, (_, local_rank, local_size) in enumerate(resource_pool.local_ranks()):
            info = RankInfo(rank, resource_pool.world_size, local_rank, local_size, "127.0.0.1", port)
            host = RankHost()
            try:
                self._infos.append(host.build(info, spec, export_env=False))
            except Exception as exc:
                cause, tb = describe_exception(exc)
                raise WorkerError(rank, f"{spec.cls.__qualname__}.__init__", cause, tb, exc) from exc
            self._hosts.append(host)

    @property
    def world_size(self) -> int:
        return len(self._hosts)

    def submit(self, ranks: list[int], role: str | None, method: str, per_rank: PerRank, label: str) -> list[Any]:
        if not self._hosts:
            raise RuntimeError(f"cannot call {label}: the worker group was shut down")
        outputs = []
        for rank, (args, kwargs) in zip(ranks, per_rank):
            try:
                outputs.append(self._hosts[rank].call(role, method, args, kwargs))
            except Exception as exc:
                cause, tb = describe_exception(exc)
                raise WorkerError(rank, label, cause, tb, exc) from exc
        return outputs

    def wait(self, handles: list[Any], ranks: list[int], label: str) -> list[Any]:
        return list(handles)

    def host_infos(self) -> list[HostInfo]:
        return list(self._infos)

    def shutdown(self) -> None:
        self._hosts = []


class LocalWorkerGroup(WorkerGroup[W]):
    """``WorkerGroup`` whose ranks live in the controller's process (default: one rank)."""

    def __init__(self, resource_pool: ResourcePool | None, cls_with_init: ClassWithInitArgs[W]) -> None:
        pool = resource_pool if resource_pool is not None else ResourcePool([1])
        roles = colocated_role_classes(cls_with_init) if issubclass(cls_with_init.cls, ColocatedWorker) else None
        super().__init__(LocalBackend(pool, cls_with_init), cls_with_init.cls, colocated_roles=roles)
