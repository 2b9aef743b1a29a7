"""What a schedule sees of the trainer it drives (a protocol, so schedules do not import the core)."""

from __future__ import annotations

from typing import Any, Protocol

from hybridflow.config import PPOConfig
from hybridflow.trainer.phases import WorkerGroups
from hybridflow.trainer.producer import Producer


class TrainerState(Protocol):
    """The trainer's parts a schedule reads: the step counter, the producer, the workers, the
    training loader and what a resume restored; and the weight sync it calls."""

    config: PPOConfig
    global_steps: int
    producer: Producer
    workers: WorkerGroups
    train_loader: Any
    resumed_state: dict[str, Any]

    def sync_rollout_weights(self) -> dict[str, float]: ...
