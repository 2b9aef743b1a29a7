"""What a worker group is built from: where ranks go (``ResourcePool``) and what they run
(``ClassWithInitArgs``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Generic, TypeVar

__all__ = ["ResourcePool", "ClassWithInitArgs"]

W = TypeVar("W")


class ResourcePool:
    """Processes per node: ``process_on_nodes[i]`` ranks on node ``i`` (world size = their sum).

    ``max_colocate_count`` separate worker groups may share one process slot (each gets that
    fraction of the slot's CPUs/GPUs). ``use_gpu`` gives every process one GPU (Ray backend);
    ``n_gpus_per_node`` is verl's name for the processes per node (informational here).
    """

    def __init__(
        self,
        process_on_nodes: Sequence[int] | None = None,
        max_colocate_count: int = 1,
        n_gpus_per_node: int = 0,
        use_gpu: bool = False,
    ) -> None:
        nodes = [1] if process_on_nodes is None else [int(n) for n in process_on_nodes]
        if not nodes or any(n < 1 for n in nodes):
            raise ValueError(
                f"process_on_nodes must be a non-empty list of positive counts, got {list(process_on_nodes or [])}"
            )
        if max_colocate_count < 1:
            raise ValueError(f"max_colocate_count must be >= 1, got {max_colocate_count}")
        if n_gpus_per_node < 0:
            raise ValueError(f"n_gpus_per_node must be >= 0, got {n_gpus_per_node}")
        self.process_on_nodes = nodes
        self.max_colocate_count = int(max_colocate_count)
        self.n_gpus_per_node = int(n_gpus_per_node)
        self.use_gpu = bool(use_gpu)

    @property
    def world_size(self) -> int:
        return sum(self.process_on_nodes)

    def local_ranks(self) -> list[tuple[int, int, int]]:
        """``(node, local_rank, local_world_size)`` of every global rank, in rank order."""
        return [(node, local, count) for node, count in enumerate(self.process_on_nodes) for local in range(count)]

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(process_on_nodes={self.process_on_nodes}, "
            f"max_colocate_count={self.max_colocate_count}, use_gpu={self.use_gpu})"
        )


class ClassWithInitArgs(Generic[W]):
    """A worker class and the arguments to construct it with, on whichever rank it lands.

    The class must be importable by module path when the Ray backend is used (Ray pickles
    it by reference).
    """

    def __init__(self, cls: type[W], *args: Any, **kwargs: Any) -> None:
        if not isinstance(cls, type):
            raise TypeError(f"ClassWithInitArgs needs a class, got {type(cls).__name__}: {cls!r}")
        self.cls = cls
        self.args = args
        self.kwargs = kwargs

    def build(self) -> W:
        """Construct the worker (call inside ``rank_context`` so it learns its rank)."""
        return self.cls(*self.args, **self.kwargs)

    def __repr__(self) -> str:
        return f"ClassWithInitArgs({self.cls.__qualname__})"
