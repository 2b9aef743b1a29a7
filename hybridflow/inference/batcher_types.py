"""The continuous batcher's public data: a request, one response, the finish reasons, the counters.

A :class:`GenRequest` goes into :class:`~hybridflow.inference.continuous.ContinuousBatcher`
(directly or through the :class:`~hybridflow.inference.generation_engine.GenerationEngine`), and
each of its ``n`` responses comes back as a :class:`SampleOutput`; :class:`BatcherStats` counts
what the batcher did.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import torch

from hybridflow.inference.sampling import GenerationParams

# What torch.Generator.manual_seed accepts: any int64 or uint64 value.
SEED_MIN, SEED_MAX = -(2**63), 2**64 - 1

FINISH_STOP = "stop"
FINISH_LENGTH = "length"
FINISH_ABORT = "abort"  # abort_all(): the tokens so far are handed back

StopCheck = Callable[[Sequence[int]], bool]
TokenCallback = Callable[[int, int], None]  # (row of the request, token id)
# What step() reports per request: its n outputs, or the exception that failed it alone.
Finished = tuple[int, "list[SampleOutput] | Exception"]


@dataclass(frozen=True)
class GenRequest:
    """One request: ``params.n`` responses to ``prompt_ids``.

    ``params`` carries the limits and settings of :class:`GenerationParams`; ``top_logprobs``
    asks for the k most likely tokens at every step; ``stop_check(response_ids)`` is asked
    after every token and ends the response when it returns True (e.g. a stop string appeared
    in the decoded text); ``seed`` gives the request its own random generator, so its samples
    do not depend on which other requests share the batch. ``on_token(row, token_id)`` is
    called on the batcher's thread with each token as soon as it is sampled (``row`` in
    ``[0, n)`` says which response); it must be quick, and an exception in it fails the
    request alone. A server streams with it. ``group`` names the client call the request
    belongs to (a completion with 64 prompts is 64 requests of one group); the batcher shares
    its rows fairly between groups (see :class:`~hybridflow.inference.continuous.ContinuousBatcher`).
    ``None``: a group of its own.

    A vision-language prompt (Qwen2-VL) also carries ``images`` — the processor's image inputs
    for it (``pixel_values``, ``image_grid_thw``) — and ``prompt_positions``, its 3-D rotary
    positions ``(3, len(prompt_ids))``; the batcher prefills it with both, and its response
    tokens continue past the prompt's largest position (see :mod:`hybridflow.inference.continuous`).
    """

    prompt_ids: tuple[int, ...]
    params: GenerationParams
    top_logprobs: int = 0
    stop_check: StopCheck | None = None
    seed: int | None = None
    on_token: TokenCallback | None = None
    group: int | None = None
    images: Mapping[str, torch.Tensor] | None = field(default=None, compare=False)
    prompt_positions: torch.Tensor | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if not self.prompt_ids:
            raise ValueError("prompt_ids is empty; a request needs at least one prompt token")
        if self.prompt_positions is not None and tuple(self.prompt_positions.shape) != (3, len(self.prompt_ids)):
            raise ValueError(
                f"prompt_positions must be (3, {len(self.prompt_ids)}) (per-axis rotary positions of the prompt), "
                f"got {tuple(self.prompt_positions.shape)}"
            )
        if self.images is not None and self.prompt_positions is None:
            raise ValueError("a request with images needs prompt_positions (the prompt's 3-D rotary positions)")
        if self.top_logprobs < 0:
            raise ValueError(f"top_logprobs must be >= 0, got {self.top_logprobs}")
        if self.seed is not None and not SEED_MIN <= self.seed <= SEED_MAX:
            raise ValueError(f"seed must be in [-2**63, 2**64 - 1], got {self.seed}")

    def position_shift(self) -> int:
        """How far the response's positions lie past its token count: 0 for text; for a prompt
        with 3-D positions, its largest position + 1 − its length (an image takes fewer
        positions than tokens)."""
        if self.prompt_positions is None:
            return 0
        return int(self.prompt_positions.max()) + 1 - len(self.prompt_ids)

    def positions_3d(self, num_tokens: int) -> torch.Tensor:
        """``(3, prompt + num_tokens)``: the prompt's per-axis positions (text counted up on every
        axis when it has none), then ``num_tokens`` response tokens' on all three axes."""
        prompt = self.prompt_positions
        if prompt is None:
            prompt = torch.arange(len(self.prompt_ids)).expand(3, -1)
        start = len(self.prompt_ids) + self.position_shift()
        tail = torch.arange(start, start + num_tokens).expand(3, -1)
        return torch.cat([prompt.to(torch.long).cpu(), tail], dim=1)


@dataclass
class SampleOutput:
    """One response: its token ids, the log-prob of each under the sampling temperature
    (``log softmax(z / T)[token]``, T = 1 when greedy), the ``top_logprobs`` best
    ``(token id, log-prob)`` pairs per step (empty lists when not asked for), and why it
    ended: ``"stop"`` (stop token or stop check) or ``"length"`` (max_new_tokens).

    ``"abort"`` marks a response cut short by
    :meth:`~hybridflow.inference.continuous.ContinuousBatcher.abort_all`.

    ``weight_version`` is stamped by whoever swaps weights (the
    :class:`~hybridflow.inference.generation_engine.GenerationEngine`); the batcher itself has no notion
    of versions and leaves it 0. So are ``prompt_logprobs`` / ``prompt_top_logprobs`` (the
    engine scores the prompt when asked; see
    :func:`~hybridflow.inference.prompt_scoring.prompt_log_probs`)."""

    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    top_logprobs: list[list[tuple[int, float]]] = field(default_factory=list)
    finish_reason: str | None = None
    weight_version: int = 0
    prompt_logprobs: list[float] | None = None
    prompt_top_logprobs: list[list[tuple[int, float]]] | None = None


@dataclass
class BatcherStats:
    """Counters for monitoring and for tests that check requests really share forwards.

    ``forward_requests[k]`` = forwards (prefill or decode) that served k distinct requests;
    ``forward_rows[k]`` = forwards over k cache rows (finished rows not yet dropped count).
    """

    forwards: int = 0
    prefills: int = 0
    joins: int = 0  # prefills that let new requests into a batch already decoding
    recomputed_tokens: int = 0  # tokens of running rows re-run by joins (0 where the decoder splices caches)
    reused_prefix_tokens: int = 0  # prompt tokens of joining requests copied from a cache row, not run
    requests_finished: int = 0
    requests_failed: int = 0  # failed alone (see ContinuousBatcher), not counting aborted batches
    requests_cancelled: int = 0
    requests_aborted: int = 0  # ended by abort_all with their tokens so far
    tokens_generated: int = 0
    forward_requests: Counter = field(default_factory=Counter)
    forward_rows: Counter = field(default_factory=Counter)

    def as_dict(self) -> dict[str, object]:
        return {
            "forwards": self.forwards,
            "prefills": self.prefills,
            "joins": self.joins,
            "recomputed_tokens": self.recomputed_tokens,
            "reused_prefix_tokens": self.reused_prefix_tokens,
            "requests_finished": self.requests_finished,
            "requests_failed": self.requests_failed,
            "requests_cancelled": self.requests_cancelled,
            "requests_aborted": self.requests_aborted,
            "tokens_generated": self.tokens_generated,
            "max_requests_per_forward": max(self.forward_requests, default=0),
            "max_rows_per_forward": max(self.forward_rows, default=0),
            "forward_requests_histogram": {str(k): v for k, v in sorted(self.forward_requests.items())},
            "forward_rows_histogram": {str(k): v for k, v in sorted(self.forward_rows.items())},
        }
