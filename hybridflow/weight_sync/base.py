"""The weight-sync interface, its report and its registry."""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from hybridflow.inference.weight_transfer import tensor_bytes
from hybridflow.utils.registry import Registry

NamedTensorPairs = Iterable[tuple[str, torch.Tensor]]

WEIGHT_SYNCS: Registry[type[WeightSync]] = Registry("weight sync backend")


@dataclass
class SyncReport:
    """What one sync moved: tensors, bytes, buckets (requests / files), seconds, the version set."""

    tensors: int = 0
    bytes: int = 0
    buckets: int = 0
    seconds: float = 0.0
    version: int = 0

    def metrics(self) -> dict[str, float]:
        return {
            "weight_sync/tensors": float(self.tensors),
            "weight_sync/megabytes": self.bytes / 2**20,
            "weight_sync/buckets": float(self.buckets),
            "weight_sync/version": float(self.version),
        }


class WeightSync(ABC):
    """Delivers ``(name, tensor)`` pairs to one target and stamps ``weight_version = version``.

    ``bucket_bytes`` bounds one transfer unit. :meth:`sync` raises when the target refuses the
    weights (a name it lacks, a wrong shape, a non-finite value); the target then still serves
    the weights it had.
    """

    name: str = ""

    def __init__(self, target: Any, bucket_bytes: int) -> None:
        if bucket_bytes < 1:
            raise ValueError(f"bucket_bytes must be >= 1, got {bucket_bytes}")
        self.target = target
        self.bucket_bytes = bucket_bytes

    def sync(self, named_tensors: NamedTensorPairs, version: int) -> SyncReport:
        """Deliver the weights; returns what moved."""
        report = SyncReport(version=int(version))
        start = time.perf_counter()
        self._deliver(self._counted(named_tensors, report), int(version), report)
        report.seconds = time.perf_counter() - start
        return report

    @abstractmethod
    def _deliver(self, named_tensors: NamedTensorPairs, version: int, report: SyncReport) -> None:
        """Move the pairs (counted into ``report`` as they are read) and set the version."""

    @staticmethod
    def _counted(named_tensors: NamedTensorPairs, report: SyncReport) -> Iterator[tuple[str, torch.Tensor]]:
        for name, tensor in named_tensors:
            report.tensors += 1
            report.bytes += tensor_bytes(tensor)
            yield name, tensor

    def close(self) -> None:
        """Release what the backend holds (connections, files)."""


def build_weight_sync(backend: str, target: Any, bucket_bytes: int, **kwargs: Any) -> WeightSync:
    """The registered backend ``backend`` delivering to ``target``."""
    return WEIGHT_SYNCS.get(backend)(target, bucket_bytes, **kwargs)
