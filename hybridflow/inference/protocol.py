"""The token-level contract between whoever generates and whoever asks: ids in, ids out.

An agent loop keeps a trajectory as token ids and must train on exactly the ids the sampler
produced, with the sampler's own log-probs. So the client speaks token ids only: it never
sees text, never re-tokenizes, and reports why it stopped and which weights produced the
tokens. Engines (in-process, HTTP, vLLM/SGLang adapters) implement :class:`TokenClient`;
loops depend on nothing else.

Nothing here imports workers, trainer or server: the protocol sits beside ``engine/``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Literal, Protocol, runtime_checkable

import numpy as np

StopReason = Literal["completed", "length", "aborted"]
STOP_REASONS: tuple[str, ...] = ("completed", "length", "aborted")


@dataclass(frozen=True)
class SamplingParams:
    """How to pick each token: ``temperature`` 0 is greedy; ``top_k`` -1 or 0 is off.

    ``seed`` makes one request reproducible on engines that support per-request seeds; None
    leaves the engine's own generator in charge.
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    seed: int | None = None

    def __post_init__(self) -> None:
        if not (self.temperature >= 0 and math.isfinite(self.temperature)):
            raise ValueError(f"temperature must be a finite number >= 0, got {self.temperature!r}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if self.top_k < -1:
            raise ValueError(f"top_k must be -1 (off), 0 (off) or positive, got {self.top_k!r}")

    def for_request(self, *keys: int) -> SamplingParams:
        """These settings with a seed of their own for one request (a row, a turn), derived from
        ``seed`` and ``keys``, so a sampled batch repeats exactly whatever order its requests
        reach the engine in, and no two requests share a random stream. No seed: unchanged."""
        if self.seed is None:
            return self
        state = np.random.SeedSequence([self.seed % 2**64, *keys]).generate_state(2, dtype=np.uint32)
        return replace(self, seed=(int(state[0]) << 31) ^ int(state[1]))


@dataclass(frozen=True)
class TokenOutput:
    """What one generation call produced.

    ``token_ids`` and ``log_probs`` are the sampler's own (one log-prob per generated token,
    under the sampling temperature), including the stop token when generation completed.
    ``stop_reason``: ``completed`` (a stop token), ``length`` (``max_tokens`` reached) or
    ``aborted`` (the engine gave up, e.g. for a weight update). ``weight_version`` is the
    version of the weights that generated the last token.
    """

    token_ids: list[int]
    log_probs: list[float]
    stop_reason: StopReason
    weight_version: int = 0

    def __post_init__(self) -> None:
        if self.stop_reason not in STOP_REASONS:
            raise ValueError(f"stop_reason must be one of {', '.join(STOP_REASONS)}, got {self.stop_reason!r}")
        if len(self.log_probs) != len(self.token_ids):
            raise ValueError(
                f"TokenOutput has {len(self.token_ids)} token ids but {len(self.log_probs)} log-probs; "
                "the sampler reports one log-prob per generated token"
            )


@runtime_checkable
class TokenClient(Protocol):
    """Anything that continues a token sequence.

    ``request_id`` names the trajectory: requests of one trajectory share it, so an engine
    may route them to the same replica and reuse the prompt's KV cache. ``max_tokens`` bounds
    the new tokens of this call; the client never returns more.
    """

    async def generate(
        self, request_id: str, prompt_ids: list[int], sampling: SamplingParams, max_tokens: int
    ) -> TokenOutput:
        """Generate up to ``max_tokens`` tokens after ``prompt_ids``."""
        ...
