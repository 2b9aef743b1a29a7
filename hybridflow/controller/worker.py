"""``Worker``: the base class of every role (actor, critic, rollout, ...) that runs on a rank.

A worker knows where it sits: ``rank``, ``world_size``, ``local_rank`` (index on its node),
``local_world_size``, and the torch.distributed rendezvous ``master_addr:master_port`` (rank 0's
node and a port found free there). The worker group decides these and hands them over in a
:class:`RankInfo` while it constructs the worker (:func:`rank_context`), so a subclass keeps a
plain ``__init__(self, config)`` that calls ``super().__init__()``. In a Ray actor the same
values are also in the process environment (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``); a worker built outside any group
reads them from there, or is rank 0 of 1.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import socket
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import timedelta

from hybridflow.controller.dispatch import MeshRank
from hybridflow.utils.allocator import keep_freed_memory

__all__ = ["RankInfo", "Worker", "rank_context", "current_rank_info", "find_free_port", "get_node_ip"]

_ENV_KEYS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


@dataclass(frozen=True)
class RankInfo:
    """A rank's place in its group and the rendezvous address of rank 0.

    ``master_port`` 0 means "not chosen yet" (a single-rank worker picks a free port when it
    initialises the process group).
    """

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1
    master_addr: str = "127.0.0.1"
    master_port: int = 0

    def __post_init__(self) -> None:
        if self.world_size < 1 or not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank must be in [0, world_size), got rank={self.rank}, world_size={self.world_size}")
        if self.local_world_size < 1 or not 0 <= self.local_rank < self.local_world_size:
            raise ValueError(
                f"local_rank must be in [0, local_world_size), got {self.local_rank}/{self.local_world_size}"
            )

    def env(self) -> dict[str, str]:
        """The torch.distributed environment variables for this rank."""
        values = (
            self.rank,
            self.world_size,
            self.local_rank,
            self.local_world_size,
            self.master_addr,
            self.master_port,
        )
        return {key: str(value) for key, value in zip(_ENV_KEYS, values)}

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> RankInfo:
        """Read the variables of :meth:`env`; missing ones take the single-process defaults."""
        default = cls()
        try:
            return cls(
                rank=int(environ.get("RANK", default.rank)),
                world_size=int(environ.get("WORLD_SIZE", default.world_size)),
                local_rank=int(environ.get("LOCAL_RANK", default.local_rank)),
                local_world_size=int(environ.get("LOCAL_WORLD_SIZE", default.local_world_size)),
                master_addr=environ.get("MASTER_ADDR", default.master_addr),
                master_port=int(environ.get("MASTER_PORT", default.master_port)),
            )
        except ValueError as exc:
            shown = {k: environ[k] for k in _ENV_KEYS if k in environ}
            raise ValueError(f"bad rank environment {shown}: {exc}") from None


_CURRENT_RANK: contextvars.ContextVar[RankInfo | None] = contextvars.ContextVar("hybridflow_rank_info", default=None)


@contextlib.contextmanager
def rank_context(info: RankInfo) -> Iterator[RankInfo]:
    """Within the block, :func:`current_rank_info` (and so ``Worker.__init__``) returns ``info``."""
    token = _CURRENT_RANK.set(info)
    try:
        yield info
    finally:
        _CURRENT_RANK.reset(token)


def current_rank_info() -> RankInfo:
    """The rank being constructed by a group, else the one described by the environment."""
    info = _CURRENT_RANK.get()
    return info if info is not None else RankInfo.from_env(os.environ)


def find_free_port(host: str = "") -> int:
    """A TCP port nothing listens on right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def get_node_ip() -> str:
    """This machine's address as other machines would reach it (falls back to 127.0.0.1)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        try:
            # No packet is sent: connecting a UDP socket only selects the outgoing interface.
            sock.connect(("10.255.255.255", 1))
            return str(sock.getsockname()[0])
        except OSError:
            return "127.0.0.1"


class Worker:
    """Base class for everything a worker group places on a rank."""

    def __init__(self) -> None:
        keep_freed_memory()  # a Ray actor's process runs no entry point's main()
        self._rank_info = current_rank_info()
        self._dispatch_info: dict[str, MeshRank] = {}

    # --- where this worker sits -------------------------------------------------------------
    @property
    def rank_info(self) -> RankInfo:
        return self._rank_info

    @property
    def rank(self) -> int:
        return self._rank_info.rank

    @property
    def world_size(self) -> int:
        return self._rank_info.world_size

    @property
    def local_rank(self) -> int:
        return self._rank_info.local_rank

    @property
    def local_world_size(self) -> int:
        return self._rank_info.local_world_size

    @property
    def master_addr(self) -> str:
        return self._rank_info.master_addr

    @property
    def master_port(self) -> int:
        return self._rank_info.master_port

    # --- torch.distributed -------------------------------------------------------------------
    def init_process_group(self, backend: str | None = None, timeout_s: float = 600.0) -> str:
        """Join the group's torch.distributed process group; returns the backend used.

        ``backend`` None → ``"nccl"`` when CUDA is available, else ``"gloo"``. Every rank of
        the group must call this (it blocks until all have joined). A no-op when already
        initialised.
        """
        import torch
        import torch.distributed as dist

        if dist.is_initialized():
            return str(dist.get_backend())
        chosen = backend or ("nccl" if torch.cuda.is_available() else "gloo")
        port = self.master_port
        if port == 0:
            if self.world_size > 1:
                raise RuntimeError(
                    f"rank {self.rank} of {self.world_size} has no MASTER_PORT; the worker group must set it"
                )
            port = find_free_port()
        dist.init_process_group(
            backend=chosen,
            init_method=f"tcp://{self.master_addr}:{port}",
            rank=self.rank,
            world_size=self.world_size,
            timeout=timedelta(seconds=timeout_s),
        )
        return chosen

    # --- mesh-aware dispatch -----------------------------------------------------------------
    def set_dispatch_info(self, mesh_name: str, dp_rank: int, is_collect: bool) -> None:
        """Declare this rank's data-parallel rank in ``mesh_name`` and whether its output is kept."""
        if dp_rank < 0:
            raise ValueError(f"dp_rank must be >= 0, got {dp_rank}")
        self._dispatch_info[mesh_name] = MeshRank(int(dp_rank), bool(is_collect))

    def get_dispatch_info(self, mesh_name: str) -> MeshRank:
        """What :meth:`set_dispatch_info` declared for ``mesh_name`` (the group asks once and caches)."""
        if mesh_name not in self._dispatch_info:
            raise ValueError(
                f"{type(self).__name__} rank {self.rank} has no dispatch info for mesh {mesh_name!r}; "
                f"call self.set_dispatch_info({mesh_name!r}, dp_rank, is_collect) in the worker first"
            )
        return self._dispatch_info[mesh_name]
