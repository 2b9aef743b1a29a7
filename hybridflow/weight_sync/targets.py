"""What weights are delivered to: a plain module, or the built-in engine (in-process).

A target is two-phase so that a bucketed transfer is atomic: :meth:`stage` checks each bucket
and copies it to the target's device and dtypes (nothing served changes), :meth:`swap_in`
puts every staged tensor in place at once and sets the version. A transfer that fails half-way
drops its staged copies and the old weights keep serving. The cost is one staged copy of the
weights on the receiving side while a sync runs.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from typing import Protocol, runtime_checkable

import torch
from torch import nn

from hybridflow.inference.generation_engine import GenerationEngine
from hybridflow.inference.weights import load_weights_from_folder, stage_named_tensors

NamedTensorPairs = Iterable[tuple[str, torch.Tensor]]
_ENGINE_TIMEOUT_S = 600.0


@runtime_checkable
class WeightTarget(Protocol):
    """Receives weights in two phases and reports the version it serves."""

    weight_version: int

    def stage(self, named_tensors: NamedTensorPairs) -> dict[str, torch.Tensor]: ...

    def swap_in(self, staged: dict[str, torch.Tensor], version: int) -> int: ...

    def load_folder(self, folder: str | os.PathLike, version: int) -> int: ...


class ModuleTarget:
    """A module the rollout samples from (its own copy of the policy).

    ``module`` is what a shared backend compares against; ``on_swap`` runs after the tensors
    changed (the sampler drops its packed weight copies). The caller must not generate while
    :meth:`swap_in` runs: the rollout worker syncs between rollouts.
    """

    def __init__(self, module: nn.Module, on_swap: Callable[[], None] | None = None) -> None:
        self.module = module
        self.on_swap = on_swap
        self.weight_version = 0

    def stage(self, named_tensors: NamedTensorPairs) -> dict[str, torch.Tensor]:
        return stage_named_tensors(self.module, named_tensors)

    def swap_in(self, staged: dict[str, torch.Tensor], version: int) -> int:
        targets = self.module.state_dict(keep_vars=True)
        with torch.no_grad():
            for name, tensor in staged.items():
                targets[name].copy_(tensor)  # copy_ bumps the version counter packed weights watch
        self._swapped(version)
        return len(staged)

    def load_folder(self, folder: str | os.PathLike, version: int) -> int:
        copied = load_weights_from_folder(self.module, folder)  # checks everything before copying
        self._swapped(version)
        return copied

    def stamp(self, version: int) -> None:
        """The module already holds these weights (shared with the actor): record the version."""
        self.weight_version = int(version)

    def _swapped(self, version: int) -> None:
        if self.on_swap is not None:
            self.on_swap()
        self.weight_version = int(version)


class EngineTarget:
    """The built-in :class:`GenerationEngine`: the swap waits for the running requests (no
    response mixes two versions)."""

    def __init__(self, engine: GenerationEngine, timeout_s: float = _ENGINE_TIMEOUT_S) -> None:
        self.engine = engine
        self.timeout_s = timeout_s

    @property
    def module(self) -> nn.Module:
        return self.engine.model

    @property
    def weight_version(self) -> int:
        return self.engine.weight_version

    def stage(self, named_tensors: NamedTensorPairs) -> dict[str, torch.Tensor]:
        return self.engine.stage(named_tensors)

    def swap_in(self, staged: dict[str, torch.Tensor], version: int) -> int:
        return self.engine.swap_in(staged, version).result(self.timeout_s)

    def load_folder(self, folder: str | os.PathLike, version: int) -> int:
        return self.engine.update_weights_from_disk(folder, version=version).result(self.timeout_s)

    def stamp(self, version: int) -> None:
        raise ValueError("the shared backend needs the rollout to sample from the actor's module, not an engine copy")
