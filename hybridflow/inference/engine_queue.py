"""What callers put in the engine thread's queue, and the errors a request's future can end with.

Every call into a :class:`~hybridflow.inference.generation_engine.GenerationEngine` from another
thread becomes one of these items (see :mod:`hybridflow.inference.batching_loop` for how the
engine thread handles each kind); the future it carries is how the caller gets the answer.
"""

from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass, field

import torch

from hybridflow.inference.batcher_types import GenRequest


@dataclass
class GenerateItem:
    request: GenRequest
    future: Future
    prompt_logprobs: int | None = None  # also score the prompt (k best per position when > 0)


@dataclass
class ScoreItem:
    """Prompt log-probs only (``max_tokens`` = 0): no generation, no batcher."""

    prompt_ids: tuple[int, ...]
    k: int
    future: Future


@dataclass
class UpdateWeightsItem:
    """A barrier: from a folder (``path``) or from tensors already staged on this device."""

    future: Future
    path: str | None = None
    given: str | None = None  # the path as the client wrote it, for error messages
    staged: dict[str, torch.Tensor] = field(default_factory=dict)
    version: int | None = None  # None: the current version + 1


@dataclass
class BarrierItem:
    """``sleep`` / ``clear_kv_cache``: applied once the running requests are done."""

    kind: str
    future: Future
    level: int = 1


@dataclass
class ControlItem:
    """``abort_all`` / ``resume`` / ``wake_up``: applied at once, between two steps."""

    kind: str
    future: Future
    tags: tuple[str, ...] = ()


@dataclass
class CancelItem:
    future: Future


class GenerationFailed(RuntimeError):
    """The forward pass of a batch failed; every request in it gets this error."""


class RequestRefused(ValueError):
    """The batcher cannot take the request as it is (e.g. ``n`` above its row limit)."""


class ShuttingDown(RuntimeError):
    """The engine stopped before the request was answered."""


class RequestCancelled(RuntimeError):
    """The request was cancelled (its client disconnected) before it finished."""
