"""Worker classes for the scale-out tests (importable by Ray's worker processes)."""

from __future__ import annotations

import os

import ray
import torch

from hybridflow.controller import Dispatch, register
from hybridflow.workers.actor import ActorWorker


class ProbeActorWorker(ActorWorker):
    """An ``ActorWorker`` that can also show the test its full weights and where it runs."""

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def synced_weights(self) -> dict[str, torch.Tensor]:
        """What a rollout would receive: the full tensors (gathered on every rank together)."""
        return {name: tensor.detach().clone() for name, tensor in self.engine.iter_sync_weights()}

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def engine_facts(self) -> dict[str, object]:
        return {
            "engine": type(self.engine).__name__,
            "shards": self.engine.shards_parameters,
            "pid": os.getpid(),
            "node_id": ray.get_runtime_context().get_node_id(),
            "world_size": torch.distributed.get_world_size() if torch.distributed.is_initialized() else 1,
        }
