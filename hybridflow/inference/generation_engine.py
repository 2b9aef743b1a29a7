"""The generation engine: a :class:`ContinuousBatcher` stepping on a background thread.

HTTP handlers run on the event loop and never touch the model. They hand work to this thread
through a queue and await a ``concurrent.futures.Future``::

    handler ──submit(GenRequest)──▶ inbox ──▶ engine thread: batcher.submit → step → step → …
    handler ◀──Future[list[SampleOutput]]──────── a finished request resolves its future

Weight updates go through the same queue. The thread stops admitting new requests, lets the
running ones finish on the old weights, swaps the weights, then admits what queued meanwhile:
no response ever mixes two weight versions. ``weight_version`` is the version the last update
set (disk reloads without one count up); each finished
:class:`~hybridflow.inference.batcher_types.SampleOutput` carries the version it ran on.
Cancellations (a client that went away) also go through the queue, so only the engine thread
ever touches the batcher.

The controls of the inference-server protocol (:class:`~hybridflow.inference.protocol.InferenceServer`)
are queue items too (:mod:`hybridflow.inference.engine_queue`). This module holds the engine's
construction and the methods other threads call; what the engine thread does with each item —
barriers, controls, failures kept small — is :mod:`hybridflow.inference.batching_loop`.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Iterable, Sequence
from concurrent.futures import Future
from typing import Any

import torch
from torch import nn

from hybridflow.engine.multimodal_inputs import vision_token_ids
from hybridflow.inference.batcher_types import GenRequest
from hybridflow.inference.batching_loop import BatchingLoop
from hybridflow.inference.continuous import ContinuousBatcher
from hybridflow.inference.decoders import build_decoder
from hybridflow.inference.engine_queue import (
    BarrierItem,
    CancelItem,
    ControlItem,
    GenerateItem,
    RequestRefused,
    ScoreItem,
    ShuttingDown,
    UpdateWeightsItem,
)
from hybridflow.inference.generation import Decoder
from hybridflow.inference.protocol import check_sleep_level, check_wake_tags
from hybridflow.inference.weights import (
    WeightsRejected,
    check_covers_parameters,
    stage_named_tensors,
)


class GenerationEngine(BatchingLoop):
    """Serves :class:`GenRequest` s from a background thread with continuous batching.

    ``decoder`` / ``dtype`` choose the sampler's forward (see
    :func:`~hybridflow.inference.decoders.build_decoder`), or ``decoder`` is one already built
    on ``model`` (a rollout's, so the engine and the rollout's plain sampler share one packed
    copy of the weights; the caller then keeps the two from stepping it at once and ``dtype``
    is the decoder's); ``max_rows`` bounds the
    rows of one forward; ``batch_window_s`` makes an idle engine wait that long after the
    first request for others to arrive, so a burst starts as one prefill instead of joining
    step by step (0 = start at once); ``seed`` seeds the generator of requests without a seed.
    ``owns_weights``: the module is this engine's alone, so ``sleep(level=2)`` may free its
    parameters (False for a module borrowed from a trainer: level 2 is refused).
    ``max_rows_per_group`` caps the rows one client call (:attr:`GenRequest.group`) holds while
    others wait (see :class:`~hybridflow.inference.continuous.ContinuousBatcher`; None: no cap).
    """

    def __init__(
        self,
        model: nn.Module,
        pad_token_id: int,
        *,
        decoder: str | Decoder = "auto",
        dtype: torch.dtype | None = None,
        max_rows: int = 64,
        batch_window_s: float = 0.0,
        seed: int = 0,
        owns_weights: bool = False,
        max_rows_per_group: int | None = None,
    ) -> None:
        if batch_window_s < 0:
            raise ValueError(f"batch_window_s must be >= 0, got {batch_window_s}")
        built = build_decoder(model, decoder, dtype=dtype) if isinstance(decoder, str) else decoder
        device = next(model.parameters()).device
        generator = torch.Generator(device=device).manual_seed(seed)
        batcher = ContinuousBatcher(
            built,
            pad_token_id,
            max_rows=max_rows,
            generator=generator,
            device=device,
            max_rows_per_group=max_rows_per_group,
        )
        super().__init__(model, built, batcher, batch_window_s)
        self.owns_weights = owns_weights
        self.started_at = time.time()
        # A vision-language model never answers with its vision tokens (as the rollout's sampler).
        self.suppress_token_ids = vision_token_ids(model)

    # ---- called from other threads -------------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    def reserve_rows(self, rows: int) -> None:
        """Let one forward hold at least ``rows`` rows from now on (a long-lived engine meets a
        larger batch than its first); the bound only grows, so requests already admitted are
        unaffected. The engine thread reads the bound between steps."""
        self.batcher.max_rows = max(self.batcher.max_rows, int(rows))

    def shutdown(self, timeout_s: float = 5.0) -> None:
        """Stop the thread; requests still queued or running fail with :class:`ShuttingDown`."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout_s)
        waiting = [item.future for item in self._deferred] + [item.future for item in self._barriers]
        while not self._inbox.empty():
            item = self._inbox.get_nowait()
            if not isinstance(item, CancelItem):
                waiting.append(item.future)
        self._fail(list(self._futures.values()) + waiting, ShuttingDown("the server is shutting down"))

    def submit(self, request: GenRequest, prompt_logprobs: int | None = None) -> Future:
        """Queue a request; the future resolves to its ``n`` :class:`SampleOutput` s.

        ``prompt_logprobs`` (not None) also scores the prompt: every output then carries
        ``prompt_logprobs`` (and the ``k`` best per position when ``k`` > 0).
        """
        future: Future = Future()
        if request.prompt_positions is not None and prompt_logprobs is not None:
            future.set_exception(RequestRefused("prompt log-probs of a prompt with images are not computed yet"))
            return future
        if self.suppress_token_ids:
            params = dataclasses.replace(request.params, suppress_token_ids=self.suppress_token_ids)
            request = dataclasses.replace(request, params=params)
        self._inbox.put(GenerateItem(request, future, prompt_logprobs))
        return future

    def score_prompt(self, prompt_ids: Sequence[int], k: int = 0) -> Future:
        """Queue a prompt-only scoring; the future resolves to ``(log_probs, top_or_None)``."""
        if not prompt_ids:
            raise ValueError("prompt_ids is empty; a request needs at least one prompt token")
        future: Future = Future()
        self._inbox.put(ScoreItem(tuple(int(t) for t in prompt_ids), int(k), future))
        return future

    def update_weights_from_tensors(
        self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int | None = None
    ) -> Future:
        """Stage ``named_tensors`` (checked and copied here, on the caller's thread) and queue
        the swap; the future resolves to the tensors copied. A bad tensor raises
        :class:`~hybridflow.inference.weights.WeightsRejected` before anything is queued, so
        the served weights never change half-way. ``version``: the new ``weight_version``."""
        return self.swap_in(self.stage(named_tensors, require_all=self.weights_discarded), version)

    def stage(
        self, named_tensors: Iterable[tuple[str, torch.Tensor]], require_all: bool = False
    ) -> dict[str, torch.Tensor]:
        """Check and copy tensors for a later :meth:`swap_in` (one bucket of many, over HTTP)."""
        if self.sleep_level == 2:
            raise WeightsRejected("the engine's weights are freed (sleep level 2): wake_up(['weights']) first")
        return stage_named_tensors(self.model, named_tensors, require_all=require_all)

    def swap_in(self, staged: dict[str, torch.Tensor], version: int | None = None) -> Future:
        """Queue the swap of tensors from :meth:`stage` (all at once, between two steps)."""
        if self.weights_discarded:
            check_covers_parameters(self.model, staged)
        future: Future = Future()
        self._inbox.put(UpdateWeightsItem(future, staged=staged, version=version))
        return future

    def abort_all(self) -> Future:
        """End every request in flight with its tokens so far and hold new ones until
        :meth:`resume_generation`; the future resolves to the number of requests aborted."""
        return self._control("abort_all")

    def resume_generation(self) -> Future:
        """Re-open admission after :meth:`abort_all` (the held requests start)."""
        return self._control("resume")

    def sleep(self, level: int = 1) -> Future:
        """Once the running requests are done: free the KV cache and packed weights (level 1),
        and the parameters too (level 2, only when ``owns_weights``). Requests wait until woken."""
        check_sleep_level(level)
        if level == 2 and not self.owns_weights:
            raise ValueError(
                "sleep(level=2) would free the weights of a module this engine borrows (owns_weights=False)"
            )
        future: Future = Future()
        self._inbox.put(BarrierItem("sleep", future, level))
        return future

    def wake_up(self, tags: Sequence[str] | None = None) -> Future:
        """Re-allocate ``"weights"`` (after level 2: uninitialised until the next weight
        update) and/or ``"kv_cache"``; held requests start once both are awake."""
        return self._control("wake_up", check_wake_tags(tags))

    def clear_kv_cache(self) -> Future:
        """Drop every cached key/value and packed weight copy once the running requests are done."""
        future: Future = Future()
        self._inbox.put(BarrierItem("clear_kv_cache", future))
        return future

    def _control(self, kind: str, tags: tuple[str, ...] = ()) -> Future:
        future: Future = Future()
        self._inbox.put(ControlItem(kind, future, tags))
        return future

    def cancel(self, future: Future) -> None:
        """Stop generating for ``future`` (a request from :meth:`submit`); no-op once it is done.

        A request still queued is dropped before it starts; a running one leaves the batch at
        the next step. The future fails with :class:`RequestCancelled`.
        """
        if future.done() or future.cancel():
            return
        self._inbox.put(CancelItem(future))

    @property
    def alive(self) -> bool:
        """The engine thread is running (False before :meth:`start` and after :meth:`shutdown`)."""
        return self._thread.is_alive() and not self._stop.is_set()

    def update_weights_from_disk(
        self, path: str | os.PathLike, given: str | None = None, version: int | None = None
    ) -> Future:
        """Queue a weight reload from an HF folder; the future resolves to the tensors copied.

        ``path`` must already be checked against the server's weights root (see
        :func:`~hybridflow.inference.weights.folder_under_root`); ``given`` is what the client
        sent, used in error messages instead of the resolved path; ``version`` the new
        ``weight_version`` (None: one more than now).
        """
        future: Future = Future()
        self._inbox.put(UpdateWeightsItem(future, path=os.fspath(path), given=given, version=version))
        return future

    def metrics(self) -> dict[str, Any]:
        """Batching counters (see :class:`~hybridflow.inference.continuous.BatcherStats`) and queue sizes."""
        with self._stats_lock:
            stats = self.batcher.stats.as_dict()
            running, waiting = self.batcher.num_running, self.batcher.num_waiting
        return {
            **stats,
            "engine_alive": self.alive,
            "running_requests": running,
            "waiting_requests": waiting + self._inbox.qsize() + len(self._deferred),
            "weight_version": self.weight_version,
            "paused": self.paused,
            "sleep_level": self.sleep_level,
            "uptime_s": round(time.time() - self.started_at, 3),
        }
