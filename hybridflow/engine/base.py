"""The training-engine interface and its registry.

An engine owns one trainable module, its optimizer and learning-rate schedule, and knows
how to run it over a batch in micro-batches. It takes explicit numbers, never a config
object: workers read their config and pass what the engine needs.

Batches are ``tensordict.TensorDict`` objects with one batch dimension (``DataProto.batch``).
Work is expressed with two small functions supplied by the caller:

* ``forward_fn(module, micro) -> {name: (b, ...) tensor}`` — one micro-batch forward
  (e.g. :func:`hybridflow.engine.forward.response_log_probs`; one that declares a
  ``prompt_cache`` parameter may be given the batch's prompts run once, see
  :mod:`hybridflow.engine.shared_prompt`);
* ``loss_fn(outputs, micro) -> (loss, metrics)`` — the micro-batch's share of the mini-batch
  loss. Losses are summed over micro-batches by ``backward``; the caller normalises with
  mini-batch-wide counts so the total does not depend on the split.
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from tensordict import TensorDict

from hybridflow.engine.micro_batch import MicroBatchSpec
from hybridflow.engine.micro_batch_runner import ForwardFn, LossFn
from hybridflow.utils.registry import Registry


@dataclass(frozen=True)
class StepResult:
    """Outcome of one optimizer step: pre-clip gradient norm, lr used, whether it was skipped."""

    grad_norm: float
    lr: float
    skipped: bool


class TrainEngine(ABC):
    """One trainable module + optimizer + lr schedule, run in micro-batches."""

    @property
    @abstractmethod
    def module(self) -> torch.nn.Module:
        """The live module (a colocated rollout reads it directly: no weight copy)."""

    @property
    def shards_parameters(self) -> bool:
        """True when :attr:`module` holds only this rank's shard of each weight (FSDP): a
        colocated rollout then keeps its own full copy and loads :meth:`iter_sync_weights`
        (called on every rank together) after each update."""
        return False

    @property
    @abstractmethod
    def weights_version(self) -> int:
        """A counter that grows whenever the weights change (an optimizer step taken, a
        checkpoint loaded): a rollout copy made at an older version is stale."""

    @abstractmethod
    def infer(
        self, batch: TensorDict, forward_fn: ForwardFn, micro_batch: MicroBatchSpec | None = None
    ) -> dict[str, torch.Tensor]:
        """``forward_fn`` over micro-batches without gradients; outputs in batch order, on CPU."""

    @abstractmethod
    def forward_backward(
        self, batch: TensorDict, forward_fn: ForwardFn, loss_fn: LossFn, micro_batch: MicroBatchSpec | None = None
    ) -> list[dict[str, torch.Tensor]]:
        """Accumulate gradients of Σ_micro loss_fn(...); returns each micro-batch's metrics."""

    @abstractmethod
    def optimizer_step(self) -> StepResult:
        """Clip gradients, step (skipped if the norm is not finite), zero gradients."""

    @abstractmethod
    def lr_scheduler_step(self) -> float:
        """Advance the schedule by one step; returns the new learning rate."""

    @abstractmethod
    def current_lr(self) -> float:
        """The learning rate the next optimizer step will use."""

    @abstractmethod
    def zero_grad(self) -> None:
        """Drop accumulated gradients."""

    @abstractmethod
    def iter_sync_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """``(HF name, tensor)`` of every distinct weight, LoRA merged, for a rollout copy."""

    @abstractmethod
    def save_checkpoint(self, path: str | os.PathLike) -> None:
        """Write model, optimizer, scheduler and RNG states to the folder ``path`` atomically."""

    @abstractmethod
    def load_checkpoint(self, path: str | os.PathLike, load_optimizer: bool = True) -> None:
        """Restore a folder written by :meth:`save_checkpoint`."""


@dataclass(frozen=True)
class EngineSpec:
    """What an engine supports, registered as its metadata."""

    multi_process: bool  # can train across several data-parallel ranks


# name ("torch", "fsdp") -> engine class; built as ENGINES.get(name)(module, **explicit_args),
# with ENGINES.meta(name) an EngineSpec.
ENGINES: Registry[type[TrainEngine]] = Registry("training engine")
