"""Partial rollout: a generation that survives ``abort_all`` by resuming where it stopped.

A trainer that updates weights while responses are still being generated (fully asynchronous
training) aborts the server's requests, pushes the weights, and resumes. Without help each
aborted response would be thrown away. :class:`PartialRolloutClient` wraps any
:class:`~hybridflow.inference.protocol.InferenceServer`: when a call comes back ``aborted`` it
resubmits prompt + the tokens so far for the budget that is left — the server holds the
resubmission until ``resume_generation`` — and joins the pieces. The result records the
weight version of its first token (``first_weight_version``) and of its last
(``weight_version``), so a trainer can bound how stale a sample is.

Under greedy decoding the joined response equals an uninterrupted one with the same weights
(the continuation is a fresh prefill of the same ids). A seeded sampled response does not: the
continuation gets a seed of its own (``SamplingParams.for_request``), so no random stream is
replayed.
"""

from __future__ import annotations

from typing import Any

from hybridflow.inference.protocol import InferenceServer, PromptImages, SamplingParams, TokenOutput


class PartialRolloutClient:
    """A :class:`~hybridflow.inference.protocol.TokenClient` that resumes aborted generations.

    ``max_resumes`` bounds the resubmissions of one call (a server that keeps aborting without
    progress is a bug, not something to wait out). ``resumes`` counts them over the client's
    life, for metrics.
    """

    def __init__(self, server: InferenceServer, max_resumes: int = 64) -> None:
        if max_resumes < 0:
            raise ValueError(f"max_resumes must be >= 0, got {max_resumes}")
        self.server = server
        self.max_resumes = max_resumes
        self.resumes = 0

    async def generate(
        self,
        request_id: str,
        prompt_ids: list[int],
        sampling: SamplingParams,
        max_tokens: int,
        logprobs: int = 0,
        images: PromptImages | None = None,
    ) -> TokenOutput:
        """Up to ``max_tokens`` tokens after ``prompt_ids``; never ``aborted`` unless the server
        aborted more than ``max_resumes`` times in a row of this call. ``images`` go with the
        first request and with every resubmission (the tokens so far are text after them)."""
        tokens: list[int] = []
        log_probs: list[float] = []
        tops: list[list[tuple[int, float]]] = []
        first_version: int | None = None
        extra: dict[str, Any] = {"images": images} if images is not None else {}
        out = await self.server.generate(request_id, list(prompt_ids), sampling, max_tokens, logprobs, **extra)
        for attempt in range(self.max_resumes + 1):
            if out.token_ids and first_version is None:
                first_version = out.first_weight_version
            tokens += out.token_ids
            log_probs += out.log_probs
            tops += out.top_log_probs or []
            if out.stop_reason != "aborted" or attempt == self.max_resumes:
                break
            left = max_tokens - len(tokens)
            if left < 1:  # aborted exactly at the budget: the response is complete by length
                out = TokenOutput([], [], "length", out.weight_version)
                break
            self.resumes += 1
            out = await self.server.generate(
                request_id, list(prompt_ids) + tokens, sampling.for_request(len(tokens)), left, logprobs, **extra
            )
        return TokenOutput(
            token_ids=tokens,
            log_probs=log_probs,
            stop_reason=out.stop_reason,
            weight_version=out.weight_version,
            first_weight_version=out.weight_version if first_version is None else first_version,
            top_log_probs=tops if logprobs > 0 else None,
        )
