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

Engines register their class: ``@ROLLOUTS.register("torch")``. Each class is constructed as
``cls(config, model, tokenizer)`` — see :class:`BaseRollout`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping

import torch

from hybridflow.protocol import DataProto
from hybridflow.utils.registry import Registry

NamedTensors = Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]]

ROLLOUTS: Registry[type["BaseRollout"]] = Registry("rollout")


class BaseRollout(ABC):
    """A response generator behind ``generate_sequences``.

    ``update_weights`` receives the actor's parameters after each update — a mapping or an
    iterable of ``(name, tensor)`` pairs (possibly a generator yielding them bucket by
    bucket) with the names of the policy's ``state_dict``. ``release`` frees what the engine
    holds between rollouts (KV cache, packed weights, server memory); ``resume`` makes it
    ready again.
    """

    @abstractmethod
    def generate_sequences(self, prompts: DataProto) -> DataProto:
        """Responses for every prompt row; see the module docstring for the fields."""

    @abstractmethod
    def update_weights(self, weights: NamedTensors) -> None:
        """Load new policy weights (names as in the policy's ``state_dict``)."""

    def release(self) -> None:
        """Free memory held between rollouts (default: nothing to free)."""

    def resume(self) -> None:
        """Undo :meth:`release` (default: nothing to do)."""


def get_rollout_class(name: str) -> type[BaseRollout]:
    """The rollout class registered as ``name`` (ValueError listing valid names otherwise)."""
    return ROLLOUTS.get(name)
