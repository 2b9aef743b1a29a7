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
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Literal, Protocol, runtime_checkable

import numpy as np

if TYPE_CHECKING:  # the protocol module stays importable without torch
    import torch

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
class PromptImages:
    """The images of a vision-language prompt (Qwen2-VL), for engines that take them.

    ``inputs``: the processor's image tensors (``pixel_values``, ``image_grid_thw``) of every
    image the prompt holds; ``positions``: the 3-D rotary positions ``(3, P)`` of the first
    ``P`` prompt tokens, which hold every image token. A request may carry a longer prompt (the
    same trajectory after a turn and a tool result): tokens past ``P`` are text, and text after
    the last image continues from the largest position + 1 on all three axes (transformers'
    ``get_rope_index``), which :meth:`positions_for` gives. Requests of one trajectory pass the
    same object, so an engine can tell that ``n`` rows share one prompt's images.
    """

    inputs: Mapping[str, Any]
    positions: Any = field(compare=False)  # torch.Tensor (3, P); Any keeps this module torch-free

    def __post_init__(self) -> None:
        shape = tuple(getattr(self.positions, "shape", ()))
        if len(shape) != 2 or shape[0] != 3 or shape[1] < 1:
            raise ValueError(f"PromptImages.positions must be (3, P) with P >= 1, got shape {shape}")

    def positions_for(self, length: int) -> torch.Tensor:
        """``(3, length)``: the prompt's positions, then text positions from the largest + 1."""
        import torch

        known = int(self.positions.shape[1])
        if length < known:
            raise ValueError(
                f"a prompt of {length} tokens is shorter than the {known} tokens its images were placed in"
            )
        start = int(self.positions.max()) + 1
        tail = torch.arange(start, start + length - known, dtype=torch.long).expand(3, -1)
        return torch.cat([self.positions.to(torch.long).cpu(), tail], dim=1)


TopLogProbs = list[list[tuple[int, float]]]  # per position: the k best (token id, log-prob)
WAKE_TAGS: tuple[str, ...] = ("weights", "kv_cache")


@dataclass(frozen=True)
class TokenOutput:
    """What one generation call produced.

    ``token_ids`` and ``log_probs`` are the sampler's own (one log-prob per generated token,
    under the sampling temperature), including the stop token when generation completed.
    ``stop_reason``: ``completed`` (a stop token), ``length`` (``max_tokens`` reached) or
    ``aborted`` (the engine gave up, e.g. for a weight update; the tokens so far are kept).
    ``weight_version`` is the version of the weights that generated the last token and
    ``first_weight_version`` the one that generated the first (they differ only when a
    partial rollout was resumed across a weight update; None means the same).

    Asked for: ``top_log_probs`` (the ``logprobs`` best per generated token),
    ``prompt_log_probs`` (log p(prompt[i] | prompt[:i]) for i = 1 … len(prompt) − 1: the first
    prompt token has no context, so the list is one shorter than the prompt) and
    ``prompt_top_log_probs`` (the ``prompt_logprobs`` best at those positions).
    """

    token_ids: list[int]
    log_probs: list[float]
    stop_reason: StopReason
    weight_version: int = 0
    first_weight_version: int | None = None
    top_log_probs: TopLogProbs | None = None
    prompt_log_probs: list[float] | None = None
    prompt_top_log_probs: TopLogProbs | None = None

    def __post_init__(self) -> None:
        if self.stop_reason not in STOP_REASONS:
            raise ValueError(f"stop_reason must be one of {', '.join(STOP_REASONS)}, got {self.stop_reason!r}")
        if len(self.log_probs) != len(self.token_ids):
            raise ValueError(
                f"TokenOutput has {len(self.token_ids)} token ids but {len(self.log_probs)} log-probs; "
                "the sampler reports one log-prob per generated token"
            )
        if self.first_weight_version is None:
            object.__setattr__(self, "first_weight_version", self.weight_version)


@runtime_checkable
class TokenClient(Protocol):
    """Anything that continues a token sequence.

    ``request_id`` names the trajectory: requests of one trajectory share it, so an engine
    may route them to the same replica and reuse the prompt's KV cache. ``max_tokens`` bounds
    the new tokens of this call; the client never returns more.

    A prompt with images is passed as the keyword ``images`` (:class:`PromptImages`); a loop
    passes it only for such prompts, so a client that takes no images needs no such argument.
    The built-in engine's clients take it (:class:`~hybridflow.inference.client.InProcessClient`,
    :class:`~hybridflow.inference.partial_rollout.PartialRolloutClient`); ``HttpClient`` refuses it.
    """

    async def generate(
        self, request_id: str, prompt_ids: list[int], sampling: SamplingParams, max_tokens: int
    ) -> TokenOutput:
        """Generate up to ``max_tokens`` tokens after ``prompt_ids``."""
        ...


@runtime_checkable
class InferenceServer(TokenClient, Protocol):
    """The whole contract of a rollout engine: generation plus the controls a trainer needs.

    Implemented by the built-in engine in this process
    (:class:`~hybridflow.inference.client.InProcessClient`) and over HTTP
    (:class:`~hybridflow.inference.client.HttpClient` against ``hybridflow serve``), and by
    the vLLM / SGLang adapters (``inference/adapters/``). One contract test suite
    (``tests/inference/test_server_contract.py``) runs against every implementation that
    imports. Every method is a coroutine.

    * ``generate(..., logprobs=k, prompt_logprobs=k)``: as :class:`TokenClient`, and also the
      ``k`` best log-probs per generated token (``logprobs`` > 0) and the prompt's own
      log-probs (``prompt_logprobs`` not None; > 0 adds the ``k`` best per position, as a
      teacher needs). ``max_tokens`` = 0 with ``prompt_logprobs`` scores the prompt only.
    * ``abort_all()``: every request in flight returns at once with the tokens it has so far
      and ``stop_reason="aborted"``; the server then holds new requests (does not fail them)
      until ``resume_generation()``. Returns how many requests were aborted.
    * ``sleep(level)``: level 1 frees the KV cache (and any packed weight copies); level 2 also
      frees the weights, which must be pushed again with ``update_weights`` after
      ``wake_up(["weights"])``. Requests wait while the server sleeps.
    * ``wake_up(tags)``: re-allocate ``"weights"`` and/or ``"kv_cache"`` (None: both), in that
      order when both (weights first, then the cache: the order that keeps peak memory low).
    * ``update_weights(named_tensors, version)``: replace weights by ``state_dict`` name,
      atomically — the running requests finish on the old weights first, and an update that
      fails (an unknown name, a wrong shape, a non-finite value) leaves the old weights
      serving. Afterwards ``weight_version == version``. Returns the tensors copied.
    * ``clear_kv_cache()``: drop cached prefixes (after a weight update they are stale).
    * ``address``: ``host:port`` of the OpenAI-compatible HTTP face, None in-process.
    """

    @property
    def address(self) -> str | None:  # read-only here: a client's is always a str, an in-process engine's None
        ...

    async def generate(
        self,
        request_id: str,
        prompt_ids: list[int],
        sampling: SamplingParams,
        max_tokens: int,
        logprobs: int = 0,
        prompt_logprobs: int | None = None,
    ) -> TokenOutput: ...

    async def abort_all(self) -> int: ...

    async def resume_generation(self) -> None: ...

    async def sleep(self, level: int = 1) -> None: ...

    async def wake_up(self, tags: Sequence[str] | None = None) -> None: ...

    async def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> int: ...

    async def clear_kv_cache(self) -> None: ...

    async def get_weight_version(self) -> int: ...


def check_sleep_level(level: int) -> int:
    if level not in (1, 2):
        raise ValueError(f"sleep level must be 1 (free the KV cache) or 2 (also the weights), got {level!r}")
    return level


def check_wake_tags(tags: Sequence[str] | None) -> tuple[str, ...]:
    """``tags`` in wake-up order (weights before the KV cache); None means both."""
    if tags is None:
        return WAKE_TAGS
    unknown = [t for t in tags if t not in WAKE_TAGS]
    if unknown:
        raise ValueError(f"unknown wake_up tags {unknown}; valid: {', '.join(WAKE_TAGS)}")
    return tuple(t for t in WAKE_TAGS if t in tags)
