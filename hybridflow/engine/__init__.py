"""Training engines: the ``TrainEngine`` interface, its registry, the torch engine and the FSDP2 engine."""

from hybridflow.engine.base import ENGINES, EngineSpec, ForwardFn, LossFn, StepResult, TrainEngine
from hybridflow.engine.fsdp import FSDPEngine
from hybridflow.engine.micro_batch import MicroBatchSpec, plan_micro_batches, restore_order
from hybridflow.engine.torch_engine import TorchEngine

__all__ = [
    "ENGINES",
    "EngineSpec",
    "FSDPEngine",
    "ForwardFn",
    "LossFn",
    "MicroBatchSpec",
    "StepResult",
    "TorchEngine",
    "TrainEngine",
    "plan_micro_batches",
    "restore_order",
]
