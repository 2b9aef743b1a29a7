"""``RankHost``: the per-rank holder that both backends run.

In the in-process backend a host is a plain object; in the Ray backend it is the body of
the one Ray actor class of each rank. It builds the worker under its :class:`RankInfo`
and runs calls by method name (the names come from the group's ``methods`` table).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from hybridflow.controller.colocate import ColocatedWorker
from hybridflow.controller.resource_pool import ClassWithInitArgs
from hybridflow.controller.worker import RankInfo, find_free_port, get_node_ip, rank_context

__all__ = ["HostInfo", "RankHost"]


@dataclass(frozen=True)
class HostInfo:
    """Where a rank's process runs."""

    pid: int
    node_ip: str


class RankHost:
    """Builds one worker (plain or colocated) and runs its methods."""

    def __init__(self) -> None:
        self._worker: Any = None
        self._rank_info: RankInfo | None = None

    def host_info(self) -> HostInfo:
        return HostInfo(pid=os.getpid(), node_ip=get_node_ip())

    def rendezvous_address(self) -> tuple[str, int]:
        """This node's address and a free port on it (asked of rank 0's host)."""
        return get_node_ip(), find_free_port()

    def build(self, info: RankInfo, spec: ClassWithInitArgs[Any], export_env: bool) -> HostInfo:
        """Construct the worker as rank ``info.rank``.

        ``export_env`` writes the rank variables into ``os.environ`` — right for a process of
        its own (Ray actor), wrong when several ranks share the controller's process.
        """
        if export_env:
            os.environ.update(info.env())
        with rank_context(info):
            self._worker = spec.build()
        self._rank_info = info
        return self.host_info()

    def call(self, role: str | None, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Run ``method`` on the worker (or on its role ``role`` when colocated)."""
        target = self._target(role)
        func = getattr(target, method, None)
        if func is None or not callable(func):
            raise AttributeError(f"{type(target).__qualname__} has no method {method!r}")
        return func(*args, **kwargs)

    def _target(self, role: str | None) -> Any:
        if self._worker is None:
            raise RuntimeError("RankHost.call before build(): the worker was not constructed")
        if role is None:
            return self._worker
        if not isinstance(self._worker, ColocatedWorker):
            raise TypeError(f"role {role!r} requested but this rank hosts a plain {type(self._worker).__qualname__}")
        return self._worker.role(role)
