"""The engine thread: one :class:`ContinuousBatcher` stepping in the background.

HTTP handlers run on the event loop and never touch the model. They hand work to this thread
through a queue and await a ``concurrent.futures.Future``::

    handler ──submit(GenRequest)──▶ inbox ──▶ engine thread: batcher.submit → step → step → …
    handler ◀──Future[list[SampleOutput]]──────── a finished request resolves its future

Weight updates go through the same queue. The thread stops admitting new requests, lets the
running ones finish on the old weights, swaps the weights, then admits what queued meanwhile:
no response ever mixes two weight versions. ``weight_version`` is the version the last update
set (disk reloads without one count up); each finished
:class:`~hybridflow.inference.continuous.SampleOutput` carries the version it ran on.
Cancellations (a client that went away) also go through the queue, so only the engine thread
ever touches the batcher.

The controls of the inference-server protocol (:class:`~hybridflow.inference.protocol.InferenceServer`)
are queue items too. Those that must not cut into a forward — a weight update, ``sleep``,
``clear_kv_cache`` — wait until the running requests are done ("barriers"; requests that
arrive meanwhile are held). ``abort_all`` acts at once: every request in flight is answered
with its tokens so far (``finish_reason="abort"``) and admission stays closed until
``resume_generation``. A sleeping engine holds new requests until it is woken.

Failures are kept as small as they can be: a request that fails alone (see
:class:`~hybridflow.inference.continuous.ContinuousBatcher`) gets its exception and the
batch goes on; a failed forward fails the requests in that forward; anything else that goes
wrong in the loop fails what is in flight and the loop carries on. The thread never dies
while the server runs, so no future is left unanswered.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from collections import deque
from concurrent.futures import Future
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from hybridflow.inference.continuous import ContinuousBatcher, GenRequest, SampleOutput
from hybridflow.inference.decoders import build_decoder
from hybridflow.inference.protocol import check_sleep_level, check_wake_tags
from hybridflow.inference.prompt_scoring import prompt_log_probs
from hybridflow.inference.weights import (
    WeightsRejected,
    check_covers_parameters,
    free_parameters,
    load_weights_from_folder,
    restore_parameters,
    stage_named_tensors,
)

logger = logging.getLogger("hybridflow.server")

_IDLE_POLL_S = 0.05  # how often an idle engine thread looks at the stop flag


@dataclass
class _Generate:
    request: GenRequest
    future: Future
    prompt_logprobs: int | None = None  # also score the prompt (k best per position when > 0)


@dataclass
class _Score:
    """Prompt log-probs only (``max_tokens`` = 0): no generation, no batcher."""

    prompt_ids: tuple[int, ...]
    k: int
    future: Future


@dataclass
class _UpdateWeights:
    """A barrier: from a folder (``path``) or from tensors already staged on this device."""

    future: Future
    path: str | None = None
    given: str | None = None  # the path as the client wrote it, for error messages
    staged: dict[str, torch.Tensor] = field(default_factory=dict)
    version: int | None = None  # None: the current version + 1


@dataclass
class _Barrier:
    """``sleep`` / ``clear_kv_cache``: applied once the running requests are done."""

    kind: str
    future: Future
    level: int = 1


@dataclass
class _Control:
    """``abort_all`` / ``resume`` / ``wake_up``: applied at once, between two steps."""

    kind: str
    future: Future
    tags: tuple[str, ...] = ()


@dataclass
class _Cancel:
    future: Future


class GenerationFailed(RuntimeError):
    """The forward pass of a batch failed; every request in it gets this error."""


class RequestRefused(ValueError):
    """The batcher cannot take the request as it is (e.g. ``n`` above its row limit)."""


class ShuttingDown(RuntimeError):
    """The engine stopped before the request was answered."""


class RequestCancelled(RuntimeError):
    """The request was cancelled (its client disconnected) before it finished."""


class GenerationEngine:
    """Serves :class:`GenRequest` s from a background thread with continuous batching.

    ``decoder`` / ``dtype`` choose the sampler's forward (see
    :func:`~hybridflow.inference.decoders.build_decoder`); ``max_rows`` bounds the
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
        decoder: str = "auto",
        dtype: torch.dtype | None = None,
        max_rows: int = 64,
        batch_window_s: float = 0.0,
        seed: int = 0,
        owns_weights: bool = False,
        max_rows_per_group: int | None = None,
    ) -> None:
        if batch_window_s < 0:
            raise ValueError(f"batch_window_s must be >= 0, got {batch_window_s}")
        self.model = model
        self.decoder = build_decoder(model, decoder, dtype=dtype)
        device = next(model.parameters()).device
        generator = torch.Generator(device=device).manual_seed(seed)
        self.batcher = ContinuousBatcher(
            self.decoder, pad_token_id, max_rows=max_rows, generator=generator, device=device,
            max_rows_per_group=max_rows_per_group,
        )
        self.batch_window_s = batch_window_s
        self.owns_weights = owns_weights
        self.weight_version = 0
        self.started_at = time.time()
        self._inbox: queue.Queue[Any] = queue.Queue()
        self._futures: dict[int, Future] = {}  # batcher handle → its future
        self._handles: dict[Future, int] = {}  # the reverse, for cancellation
        self._prompt_scores: dict[Future, tuple[list[float], list | None]] = {}
        self._barriers: deque[_UpdateWeights | _Barrier] = deque()
        self._deferred: deque[_Generate | _Score] = deque()  # held: a barrier waits, paused, or asleep
        self.paused = False  # abort_all() closed admission until resume_generation()
        self.sleep_level = 0  # 0 awake; 1 KV cache freed; 2 weights freed too
        self._freed: dict[str, tuple[torch.Size, torch.dtype]] | None = None  # level-2 shapes
        self.weights_discarded = False  # freed and re-allocated but not yet reloaded
        self._stats_lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="hybridflow-engine", daemon=True)

    # ---- called from other threads -------------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    def shutdown(self, timeout_s: float = 5.0) -> None:
        """Stop the thread; requests still queued or running fail with :class:`ShuttingDown`."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout_s)
        waiting = [item.future for item in self._deferred] + [item.future for item in self._barriers]
        while not self._inbox.empty():
            item = self._inbox.get_nowait()
            if not isinstance(item, _Cancel):
                waiting.append(item.future)
        self._fail(list(self._futures.values()) + waiting, ShuttingDown("the server is shutting down"))

    def submit(self, request: GenRequest, prompt_logprobs: int | None = None) -> Future:
        """Queue a request; the future resolves to its ``n`` :class:`SampleOutput` s.

        ``prompt_logprobs`` (not None) also scores the prompt: every output then carries
        ``prompt_logprobs`` (and the ``k`` best per position when ``k`` > 0).
        """
        future: Future = Future()
        self._inbox.put(_Generate(request, future, prompt_logprobs))
        return future

    def score_prompt(self, prompt_ids: Sequence[int], k: int = 0) -> Future:
        """Queue a prompt-only scoring; the future resolves to ``(log_probs, top_or_None)``."""
        if not prompt_ids:
            raise ValueError("prompt_ids is empty; a request needs at least one prompt token")
        future: Future = Future()
        self._inbox.put(_Score(tuple(int(t) for t in prompt_ids), int(k), future))
        return future

    def update_weights_from_tensors(
        self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int | None = None
    ) -> Future:
        """Stage ``named_tensors`` (checked and copied here, on the caller's thread) and queue
        the swap; the future resolves to the tensors copied. A bad tensor raises
        :class:`~hybridflow.inference.weights.WeightsRejected` before anything is queued, so
        the served weights never change half-way. ``version``: the new ``weight_version``."""
        return self.swap_in(self.stage(named_tensors, require_all=self.weights_discarded), version)

    def stage(self, named_tensors: Iterable[tuple[str, torch.Tensor]], require_all: bool = False) -> dict[str, torch.Tensor]:
        """Check and copy tensors for a later :meth:`swap_in` (one bucket of many, over HTTP)."""
        if self.sleep_level == 2:
            raise WeightsRejected("the engine's weights are freed (sleep level 2): wake_up(['weights']) first")
        return stage_named_tensors(self.model, named_tensors, require_all=require_all)

    def swap_in(self, staged: dict[str, torch.Tensor], version: int | None = None) -> Future:
        """Queue the swap of tensors from :meth:`stage` (all at once, between two steps)."""
        if self.weights_discarded:
            check_covers_parameters(self.model, staged)
        future: Future = Future()
        self._inbox.put(_UpdateWeights(future, staged=staged, version=version))
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
        self._inbox.put(_Barrier("sleep", future, level))
        return future

    def wake_up(self, tags: Sequence[str] | None = None) -> Future:
        """Re-allocate ``"weights"`` (after level 2: uninitialised until the next weight
        update) and/or ``"kv_cache"``; held requests start once both are awake."""
        return self._control("wake_up", check_wake_tags(tags))

    def clear_kv_cache(self) -> Future:
        """Drop every cached key/value and packed weight copy once the running requests are done."""
        future: Future = Future()
        self._inbox.put(_Barrier("clear_kv_cache", future))
        return future

    def _control(self, kind: str, tags: tuple[str, ...] = ()) -> Future:
        future: Future = Future()
        self._inbox.put(_Control(kind, future, tags))
        return future

    def cancel(self, future: Future) -> None:
        """Stop generating for ``future`` (a request from :meth:`submit`); no-op once it is done.

        A request still queued is dropped before it starts; a running one leaves the batch at
        the next step. The future fails with :class:`RequestCancelled`.
        """
        if future.done() or future.cancel():
            return
        self._inbox.put(_Cancel(future))

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
        self._inbox.put(_UpdateWeights(future, path=os.fspath(path), given=given, version=version))
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

    # ---- the engine thread ---------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                if self._barriers and self.batcher.idle:
                    self._apply_barriers()
                self._collect(block=self.batcher.idle and not (self._deferred and self._admitting))
                if not self.batcher.idle:
                    self._step()
            except Exception as err:  # noqa: BLE001 - the loop must outlive any bug it meets
                logger.exception("engine loop failed; failing the %d requests in flight", len(self._futures))
                self._abort_running(GenerationFailed(f"generation failed ({type(err).__name__})"))

    def _collect(self, block: bool) -> None:
        """Move everything in the inbox to the batcher (or to the update queue)."""
        try:
            item = self._inbox.get(timeout=_IDLE_POLL_S) if block else self._inbox.get_nowait()
        except queue.Empty:
            return
        items = [item]
        if block and self.batch_window_s > 0:
            deadline = time.monotonic() + self.batch_window_s
            while (left := deadline - time.monotonic()) > 0:
                try:
                    items.append(self._inbox.get(timeout=left))
                except queue.Empty:
                    break
        while True:
            try:
                items.append(self._inbox.get_nowait())
            except queue.Empty:
                break
        for item in items:
            if isinstance(item, _Cancel):
                self._cancel(item.future)
            elif isinstance(item, _Control):
                self._apply_control(item)
            elif isinstance(item, (_UpdateWeights, _Barrier)):
                self._barriers.append(item)
            elif self._admitting and not self._deferred:
                self._admit(item)
            else:
                self._deferred.append(item)
        self._release_deferred()

    @property
    def _admitting(self) -> bool:
        """New requests may start: no barrier waits, not paused, not asleep."""
        return not self._barriers and not self.paused and self.sleep_level == 0

    def _release_deferred(self) -> None:
        while self._deferred and self._admitting:
            self._admit(self._deferred.popleft())

    def _admit(self, item: _Generate | _Score) -> None:
        if not item.future.set_running_or_notify_cancel():
            return  # the client went away before we started
        if self.weights_discarded:
            item.future.set_exception(RequestRefused(
                "the weights were freed by sleep(level=2) and not reloaded: push them with update_weights first"
            ))
            return
        try:
            if isinstance(item, _Score):
                item.future.set_result(prompt_log_probs(self.model, item.prompt_ids, item.k))
                return
            if item.prompt_logprobs is not None:
                scores = prompt_log_probs(self.model, item.request.prompt_ids, item.prompt_logprobs)
            with self._stats_lock:
                handle = self.batcher.submit(item.request)
        except ValueError as err:
            item.future.set_exception(RequestRefused(str(err)))
            return
        except Exception as err:  # noqa: BLE001 - broken, not refused: still answer it
            item.future.set_exception(err)
            return
        self._futures[handle] = item.future
        self._handles[item.future] = handle
        if item.prompt_logprobs is not None:
            self._prompt_scores[item.future] = scores

    def _cancel(self, future: Future) -> None:
        handle = self._handles.pop(future, None)
        if handle is not None:
            self._futures.pop(handle, None)
            with self._stats_lock:
                self.batcher.cancel(handle)
        else:  # still held back behind a weight update
            self._deferred = deque(item for item in self._deferred if item.future is not future)
        self._fail([future], RequestCancelled("the request was cancelled"))

    def _step(self) -> None:
        try:
            with self._stats_lock:
                finished = self.batcher.step()
        except Exception as err:  # noqa: BLE001 - a failed forward must not take the server down
            logger.exception("generation step failed; failing the %d requests in flight", len(self._futures))
            self._abort_running(GenerationFailed(f"generation failed: {err}"))
            return
        for handle, result in finished:
            future = self._futures.pop(handle)
            self._handles.pop(future, None)
            if future.done():
                continue
            if isinstance(result, Exception):
                self._prompt_scores.pop(future, None)
                logger.error("request %d failed alone: %s: %s", handle, type(result).__name__, result,
                             exc_info=result)
                future.set_exception(result)
            else:
                self._resolve(future, result)

    def _resolve(self, future: Future, outputs: list[SampleOutput]) -> None:
        # Weights are swapped only while the batcher is idle, so the version now is the one
        # that produced every token of this request (the first and the last).
        scores = self._prompt_scores.pop(future, None)
        for out in outputs:
            out.weight_version = self.weight_version
            if scores is not None:
                out.prompt_logprobs, out.prompt_top_logprobs = scores
        if not future.done():
            future.set_result(outputs)

    def _abort_running(self, err: Exception) -> None:
        with self._stats_lock:
            handles = self.batcher.abort_running()
        futures = [self._futures.pop(h) for h in handles if h in self._futures]
        for future in futures:
            self._handles.pop(future, None)
            self._prompt_scores.pop(future, None)
        self._fail(futures, err)

    def _apply_control(self, item: _Control) -> None:
        if not item.future.set_running_or_notify_cancel():
            return
        if item.kind == "abort_all":
            item.future.set_result(self._abort_all())
        elif item.kind == "resume":
            self.paused = False
            item.future.set_result(None)
        else:  # wake_up
            if "weights" in item.tags and self._freed is not None:
                restore_parameters(self.model, self._freed)
                self._freed, self.weights_discarded = None, True
            if "weights" in item.tags and self.sleep_level == 2:
                self.sleep_level = 1
            if "kv_cache" in item.tags and self.sleep_level == 1:
                self.sleep_level = 0
            item.future.set_result(self.sleep_level)

    def _abort_all(self) -> int:
        """Answer every request in flight with what it has; close admission."""
        self.paused = True
        with self._stats_lock:
            aborted = self.batcher.abort_all()
        for handle, outputs in aborted:
            future = self._futures.pop(handle, None)
            if future is not None:
                self._handles.pop(future, None)
                self._resolve(future, outputs)
        held = list(self._deferred)
        self._deferred.clear()
        for item in held:
            if item.future.set_running_or_notify_cancel():
                if isinstance(item, _Score):
                    item.future.set_exception(RequestCancelled("aborted before it started"))
                else:
                    item.future.set_result([SampleOutput(finish_reason="abort") for _ in range(item.request.params.n)])
        return len(aborted) + len(held)

    def _apply_barriers(self) -> None:
        while self._barriers:
            item = self._barriers.popleft()
            if not item.future.set_running_or_notify_cancel():
                continue
            try:
                result = self._update(item) if isinstance(item, _UpdateWeights) else self._barrier(item)
            except Exception as err:  # noqa: BLE001 - a bad folder (WeightsRejected) or a failed copy
                if not isinstance(err, WeightsRejected):
                    logger.exception("%s failed", type(item).__name__)
                item.future.set_exception(err)
                continue
            item.future.set_result(result)
        self._release_deferred()

    def _update(self, update: _UpdateWeights) -> int:
        if self.sleep_level == 2:
            raise WeightsRejected("the engine's weights are freed (sleep level 2): wake_up(['weights']) first")
        if update.path is not None:
            copied = load_weights_from_folder(self.model, update.path, update.given)
        else:
            targets = self.model.state_dict(keep_vars=True)
            with torch.no_grad():
                for name, tensor in update.staged.items():
                    targets[name].copy_(tensor)  # copy_ bumps the version counter packed weights watch
            copied = len(update.staged)
        self.decoder.invalidate_weights()
        self.weights_discarded = False
        self.weight_version = self.weight_version + 1 if update.version is None else int(update.version)
        return copied

    def _barrier(self, item: _Barrier) -> int:
        self.decoder.release()
        if item.kind == "sleep":
            if item.level == 2 and self._freed is None:
                self._freed = free_parameters(self.model)
            self.sleep_level = max(self.sleep_level, item.level)
        return self.sleep_level

    @staticmethod
    def _fail(futures: list[Future], err: Exception) -> None:
        for future in futures:
            if not future.done():
                future.set_exception(err)
