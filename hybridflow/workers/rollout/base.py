"""The rollout interface and its registry (``actor_rollout_ref.rollout.name``).

A rollout turns prompts into responses. Input: a ``DataProto`` whose batch holds left-padded
``input_ids`` / ``attention_mask`` / ``position_ids`` (B, P) and whose ``meta_info`` may carry
per-call facts (``eos_token_id``, ``pad_token_id``, ``do_sample``, ``validate``,
``temperature``, ``top_p``, ``top_k``, ``n``, ``response_length``, ``seed``). Output: verl's
fields for every response row (B·n rows, row i answers prompt i // n) —

    prompts (B·n, P)            left-padded prompt ids
    responses (B·n, T)          right-padded to T = response_length with the pad id
    response_mask (B·n, T)      1 up to and including the stop token
    input_ids (B·n, P+T)        prompts ‖ responses
    attention_mask (B·n, P+T)   prompt mask ‖ response_mask
    position_ids (B·n, P+T)     prompt positions, then last prompt position + 1, + 2, …
    rollout_log_probs (B·n, T)  log-prob of each sampled token under the sampling
                                temperature (0 on padding)

plus the input's non-tensor columns repeated per response and its ``meta_info``.

Metrics (an agent loop's ``num_turns/*``, ...) are not in the output's ``meta_info``:
:meth:`BaseRollout.generate_with_metrics` returns them next to the data as a
:class:`RolloutOutput`.

Engines register their class: ``@ROLLOUTS.register("torch")``. Each class is constructed as
``cls(config, model, tokenizer)`` — see :class:`BaseRollout`. What a rollout can do beyond
generating and taking weights is declared in its :class:`RolloutCapabilities`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, ClassVar, NamedTuple

import torch

from hybridflow.protocol import DataProto
from hybridflow.utils.registry import Registry

NamedTensors = Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]]

ROLLOUTS: Registry[type[BaseRollout]] = Registry("rollout")


class RolloutOutput(NamedTuple):
    """What a rollout returns: the generated ``data`` and the call's ``metrics`` (name →
    value; empty when the rollout measures nothing). Unpacks as a pair: ``data, metrics = ...``.
    Through a worker group the ranks' data are concatenated and ``metrics`` becomes
    ``{name: [one value per rank]}``."""

    data: DataProto
    metrics: dict[str, Any]


@dataclass(frozen=True)
class RolloutCapabilities:
    """The optional capabilities of a rollout class (its ``capabilities`` class attribute).

    Callers check a flag instead of probing for attributes; calling a method of a capability
    the rollout does not declare raises :class:`RolloutCapabilityError` naming both.
    """

    partial_rollout: bool = False
    """``set_partial_rollout(True)``, ``abort_generation``, ``resume_generation``: the call in
    flight can be aborted, given new weights while its requests wait, and resumed."""
    sleep_wake: bool = False
    """``release`` frees what the engine holds between rollouts (KV cache, packed weights);
    ``resume`` makes it ready again."""
    weight_version: bool = False
    """``set_weight_version``: the engine stamps generated tokens with the version of the
    weights that produced them."""
    swap_lock: bool = False
    """``swap_lock``: a lock that starting a generation holds, so a weight swap and its version
    stamp taken under it never fall between the two."""


class RolloutCapabilityError(ValueError):
    """A rollout was asked for a capability its class does not declare."""

    def __init__(self, rollout: object, capability: str, what: str) -> None:
        super().__init__(
            f"{type(rollout).__name__} does not support {what} (RolloutCapabilities.{capability} is False); "
            f"choose a rollout that declares it (the built-in engine's agent_loop rollout declares all)"
        )
        self.capability = capability


class BaseRollout(ABC):
    """A response generator behind ``generate_sequences``.

    ``update_weights`` receives the actor's parameters after each update — a mapping or an
    iterable of ``(name, tensor)`` pairs (possibly a generator yielding them bucket by
    bucket) with the names of the policy's ``state_dict``.

    Optional capabilities are declared in :attr:`capabilities` (default: none); a method of an
    undeclared capability raises :class:`RolloutCapabilityError`.
    """

    capabilities: ClassVar[RolloutCapabilities] = RolloutCapabilities()

    @abstractmethod
    def generate_sequences(self, prompts: DataProto) -> DataProto:
        """Responses for every prompt row; see the module docstring for the fields."""

    def generate_with_metrics(self, prompts: DataProto) -> RolloutOutput:
        """:meth:`generate_sequences` with the call's metrics (default: none measured)."""
        return RolloutOutput(self.generate_sequences(prompts), {})

    @abstractmethod
    def update_weights(self, weights: NamedTensors) -> None:
        """Load new policy weights (names as in the policy's ``state_dict``)."""

    def weights_changed(self) -> None:
        """The module this rollout samples from had its tensors replaced in place (a weight
        sync's swap): drop anything derived from them (default: nothing is)."""

    def close(self) -> None:
        """Stop what the rollout keeps for its life (an engine thread); default: nothing."""

    # --- capability: sleep_wake ---------------------------------------------------------------
    def release(self) -> None:
        """Free memory held between rollouts (KV cache, packed weights)."""
        raise RolloutCapabilityError(self, "sleep_wake", "release() (freeing memory between rollouts)")

    def resume(self) -> None:
        """Undo :meth:`release`."""
        raise RolloutCapabilityError(self, "sleep_wake", "resume() (after release())")

    # --- capability: partial_rollout ----------------------------------------------------------
    def set_partial_rollout(self, enabled: bool) -> None:
        """Generate on an engine :meth:`abort_generation` can interrupt (asynchronous training).
        Turning it off is always allowed."""
        if enabled:
            raise RolloutCapabilityError(self, "partial_rollout", "partial rollout (abort, swap weights, resume)")

    def abort_generation(self) -> int:
        """Abort the call in flight; its requests wait for :meth:`resume_generation`. Returns how
        many were aborted."""
        raise RolloutCapabilityError(self, "partial_rollout", "abort_generation()")

    def resume_generation(self) -> None:
        """Let the requests :meth:`abort_generation` stopped continue."""
        raise RolloutCapabilityError(self, "partial_rollout", "resume_generation()")

    # --- capability: weight_version -----------------------------------------------------------
    def set_weight_version(self, version: int) -> None:
        """The version of the weights now loaded (stamped on the tokens generated from here)."""
        raise RolloutCapabilityError(self, "weight_version", "set_weight_version()")

    # --- capability: swap_lock ----------------------------------------------------------------
    @property
    def swap_lock(self) -> AbstractContextManager[Any]:
        """Held while a generation starts; a weight swap and its version stamp take it too."""
        raise RolloutCapabilityError(self, "swap_lock", "swap_lock")


def get_rollout_class(name: str) -> type[BaseRollout]:
    """The rollout class registered as ``name`` (ValueError listing valid names otherwise)."""
    return ROLLOUTS.get(name)
