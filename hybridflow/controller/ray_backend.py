"""The Ray backend: one Ray actor (a :class:`RankHost`) per rank, on placement groups.

``init_ray()`` starts a local Ray instance with this machine's CPUs when no address is given,
or joins a running cluster (``"auto"`` or ``"host:port"``, as started by ``ray start --head``).
A :class:`RayResourcePool` reserves one placement group per node (bundles of
``cpus_per_process`` CPUs, plus one GPU each when ``use_gpu``). :class:`RayWorkerGroup` places
rank ``r`` on its node's bundle, tells every rank the rendezvous address (rank 0's node and
a free port there), and maps Ray failures to ``WorkerError`` / ``WorkerDiedError`` naming
the rank.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Sequence
from typing import Any, TypeVar

import ray
from ray.exceptions import GetTimeoutError, RayActorError, RayError, RayTaskError
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from hybridflow.controller.colocate import ColocatedWorker, colocated_role_classes
from hybridflow.controller.errors import WorkerDiedError, WorkerError, WorkerTimeoutError
from hybridflow.controller.host import HostInfo, RankHost
from hybridflow.controller.resource_pool import ClassWithInitArgs, ResourcePool
from hybridflow.controller.worker import RankInfo
from hybridflow.controller.worker_group import PerRank, WorkerGroup
from hybridflow.protocol import DataProto

__all__ = ["init_ray", "RayResourcePool", "RayBackend", "RayWorkerGroup", "as_ray_resource_pool"]

W = TypeVar("W")

_ANSI = re.compile(r"\x1b\[[0-9;]*m")  # Ray colours its task names in tracebacks

# The one actor class of every rank; what it hosts is decided by ``RankHost.build``.
_RayRankHost = ray.remote(RankHost)


def init_ray(address: str | None = None, num_cpus: int | None = None) -> None:
    """Start or join Ray once per process.

    ``address`` None/"" → a new private local instance with ``num_cpus`` (default: this machine's
    CPUs) and no dashboard, even if a cluster runs on this machine; ``"auto"`` or ``"host:port"`` → join that cluster (its resources are the
    cluster's). Already initialised → nothing happens.
    """
    if ray.is_initialized():
        return
    if address:
        if num_cpus is not None:
            raise ValueError(f"num_cpus={num_cpus} cannot be set when joining the Ray cluster at {address!r}")
        ray.init(address=address)
    else:
        # "local": a private instance even when `ray start` left a cluster address on this machine.
        ray.init(address="local", num_cpus=num_cpus or os.cpu_count() or 1, include_dashboard=False)


class RayResourcePool(ResourcePool):
    """``ResourcePool`` backed by one STRICT_PACK placement group per node (created on first use)."""

    def __init__(
        self,
        process_on_nodes: Sequence[int] | None = None,
        use_gpu: bool = False,
        max_colocate_count: int = 1,
        cpus_per_process: float = 1.0,
        ready_timeout_s: float = 120.0,
    ) -> None:
        super().__init__(process_on_nodes, max_colocate_count, use_gpu=use_gpu)
        if use_gpu:
            self.n_gpus_per_node = max(self.process_on_nodes)
        if cpus_per_process <= 0:
            raise ValueError(f"cpus_per_process must be > 0, got {cpus_per_process}")
        self.cpus_per_process = float(cpus_per_process)
        self.ready_timeout_s = float(ready_timeout_s)
        self._pgs: list[PlacementGroup] = []

    def bundle(self) -> dict[str, float]:
        return {"CPU": self.cpus_per_process, "GPU": 1.0} if self.use_gpu else {"CPU": self.cpus_per_process}

    def placement_groups(self) -> list[PlacementGroup]:
        """One ready placement group per node; raises if the cluster cannot hold them in time."""
        if self._pgs:
            return self._pgs
        init_ray()
        pgs = [placement_group([self.bundle()] * count, strategy="STRICT_PACK") for count in self.process_on_nodes]
        try:
            ray.get([pg.ready() for pg in pgs], timeout=self.ready_timeout_s)
        except GetTimeoutError:
            for pg in pgs:
                remove_placement_group(pg)
            raise RuntimeError(
                f"Ray could not reserve {self.process_on_nodes} processes of {self.bundle()} "
                f"within {self.ready_timeout_s:.0f} s; "
                f"cluster resources: {ray.cluster_resources()}, available: {ray.available_resources()}"
            ) from None
        self._pgs = pgs
        return pgs

    def remove(self) -> None:
        """Give the reserved bundles back to Ray."""
        for pg in self._pgs:
            remove_placement_group(pg)
        self._pgs = []


class RayBackend:
    """Ranks as Ray actors; failures mapped to errors that name the rank."""

    def __init__(
        self,
        pool: RayResourcePool,
        spec: ClassWithInitArgs[Any],
        call_timeout_s: float | None = None,
        poll_s: float = 0.2,
    ) -> None:
        self.call_timeout_s = call_timeout_s
        self.poll_s = poll_s
        self._infos: list[HostInfo] = []
        self._actors = self._create_actors(pool)
        try:
            self._infos = self._build(pool, spec)
        except WorkerError:
            self.shutdown()
            raise

    def _build(self, pool: RayResourcePool, spec: ClassWithInitArgs[Any]) -> list[HostInfo]:
        """Rank 0's host names the rendezvous address; then every rank builds its worker."""
        label = f"{spec.cls.__qualname__}.__init__"
        [(master_addr, master_port)] = self.wait([self._actors[0].rendezvous_address.remote()], [0], label)
        build_refs = []
        for rank, (_, local_rank, local_size) in enumerate(pool.local_ranks()):
            info = RankInfo(rank, pool.world_size, local_rank, local_size, master_addr, master_port)
            build_refs.append(self._actors[rank].build.remote(info, spec, True))
        return self.wait(build_refs, list(range(len(build_refs))), label)

    def _create_actors(self, pool: RayResourcePool) -> list[Any]:
        share = 1.0 / pool.max_colocate_count
        actors = []
        for pg, count in zip(pool.placement_groups(), pool.process_on_nodes):
            for local_rank in range(count):
                strategy = PlacementGroupSchedulingStrategy(placement_group=pg, placement_group_bundle_index=local_rank)
                options: dict[str, Any] = {"num_cpus": pool.cpus_per_process * share, "scheduling_strategy": strategy}
                if pool.use_gpu:
                    options["num_gpus"] = share
                actors.append(_RayRankHost.options(**options).remote())
        return actors

    @property
    def world_size(self) -> int:
        return len(self._actors)

    def submit(self, ranks: list[int], role: str | None, method: str, per_rank: PerRank, label: str) -> list[Any]:
        if not self._actors:
            raise RuntimeError(f"cannot call {label}: the worker group was shut down")
        per_rank = _share_replicated(per_rank)
        return [self._actors[r].call.remote(role, method, args, kwargs) for r, (args, kwargs) in zip(ranks, per_rank)]

    def wait(self, handles: list[Any], ranks: list[int], label: str) -> list[Any]:
        """Outputs in rank order; the first failure (exception, dead process, timeout) is raised."""
        pending = dict(zip(handles, ranks))
        outputs: dict[int, Any] = {}
        deadline = None if self.call_timeout_s is None else time.monotonic() + self.call_timeout_s
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1, timeout=self.poll_s)
            for ref in ready:
                rank = pending.pop(ref)
                outputs[rank] = self._get(ref, rank, label)
            if deadline is not None and pending and time.monotonic() > deadline:
                late = sorted(pending.values())
                raise WorkerTimeoutError(late[0], label, f"no result after {self.call_timeout_s} s from ranks {late}")
        return [outputs[r] for r in ranks]

    def _get(self, ref: Any, rank: int, label: str) -> Any:
        try:
            return ray.get(ref)
        except RayTaskError as exc:
            cause = exc.cause
            raise WorkerError(rank, label, f"{type(cause).__name__}: {cause}", _ANSI.sub("", str(exc)), cause) from None
        except RayActorError as exc:
            where = f"pid {self._infos[rank].pid} on {self._infos[rank].node_ip}: " if rank < len(self._infos) else ""
            raise WorkerDiedError(rank, label, f"{where}{type(exc).__name__}: {exc}") from None
        except RayError as exc:
            raise WorkerError(rank, label, f"{type(exc).__name__}: {exc}") from None

    def host_infos(self) -> list[HostInfo]:
        return list(self._infos)

    def shutdown(self) -> None:
        for actor in self._actors:
            ray.kill(actor, no_restart=True)
        self._actors = []


def _share_replicated(per_rank: PerRank) -> PerRank:
    """Put a DataProto that goes to several ranks into the object store once, not once per rank.

    Ray resolves an ObjectRef passed as a top-level argument before the method runs, so the
    worker still receives the DataProto itself.
    """
    counts: dict[int, int] = {}
    for args, kwargs in per_rank:
        for value in (*args, *kwargs.values()):
            if isinstance(value, DataProto):
                counts[id(value)] = counts.get(id(value), 0) + 1
    refs: dict[int, Any] = {}

    def shared(value: Any) -> Any:
        if not isinstance(value, DataProto) or counts[id(value)] < 2:
            return value
        if id(value) not in refs:
            refs[id(value)] = ray.put(value)
        return refs[id(value)]

    return [(tuple(shared(a) for a in args), {k: shared(v) for k, v in kwargs.items()}) for args, kwargs in per_rank]


class RayWorkerGroup(WorkerGroup[W]):
    """``WorkerGroup`` whose ranks are Ray actors placed on ``resource_pool``.

    A plain :class:`ResourcePool` is turned into a :class:`RayResourcePool` (1 CPU per process,
    plus 1 GPU when its ``use_gpu``) that this group removes on ``shutdown``. Ray is started
    locally if nothing initialised it.
    """

    def __init__(
        self, resource_pool: ResourcePool, cls_with_init: ClassWithInitArgs[W], call_timeout_s: float | None = None
    ) -> None:
        init_ray()
        self._own_pool = not isinstance(resource_pool, RayResourcePool)
        pool = resource_pool if isinstance(resource_pool, RayResourcePool) else as_ray_resource_pool(resource_pool)
        self.resource_pool = pool
        roles = colocated_role_classes(cls_with_init) if issubclass(cls_with_init.cls, ColocatedWorker) else None
        try:
            backend = RayBackend(pool, cls_with_init, call_timeout_s=call_timeout_s)
        except BaseException:
            if self._own_pool:
                pool.remove()
            raise
        super().__init__(backend, cls_with_init.cls, colocated_roles=roles)
        self._ray_backend = backend

    @property
    def call_timeout_s(self) -> float | None:
        """Seconds a blocking call may take before ``WorkerTimeoutError`` (None: no limit)."""
        return self._ray_backend.call_timeout_s

    @call_timeout_s.setter
    def call_timeout_s(self, value: float | None) -> None:
        if value is not None and value <= 0:
            raise ValueError(f"call_timeout_s must be > 0 or None, got {value}")
        self._ray_backend.call_timeout_s = value

    def shutdown(self) -> None:
        super().shutdown()
        if self._own_pool:
            self.resource_pool.remove()


def as_ray_resource_pool(pool: ResourcePool) -> RayResourcePool:
    """A :class:`RayResourcePool` of the same shape (1 CPU per process, 1 GPU if ``use_gpu``)."""
    return RayResourcePool(pool.process_on_nodes, use_gpu=pool.use_gpu, max_colocate_count=pool.max_colocate_count)
