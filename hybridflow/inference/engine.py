"""The engine thread: one :class:`ContinuousBatcher` stepping in the background.

HTTP handlers run on the event loop and never touch the model. They hand work to this thread
through a queue and await a ``concurrent.futures.Future``::

    handler ──submit(GenRequest)──▶ inbox ──▶ engine thread: batcher.submit → step → step → …
    handler ◀──Future[list[SampleOutput]]──────── a finished request resolves its future

Weight updates go through the same queue. The thread stops admitting new requests, lets the
running ones finish on the old weights, swaps the weights, then admits what queued meanwhile:
no response ever mixes two weight versions. ``weight_version`` counts the swaps; each
finished :class:`~hybridflow.inference.continuous.SampleOutput` carries the version it ran on. Cancellations (a client that went away) also go
through the queue, so only the engine thread ever touches the batcher.

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
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from hybridflow.inference.continuous import ContinuousBatcher, GenRequest
from hybridflow.inference.decoders import build_decoder
from hybridflow.inference.weights import WeightsRejected, load_weights_from_folder

logger = logging.getLogger("hybridflow.server")

_IDLE_POLL_S = 0.05  # how often an idle engine thread looks at the stop flag


@dataclass
class _Generate:
    request: GenRequest
    future: Future


@dataclass
class _UpdateWeights:
    path: str
    future: Future
    given: str | None = None  # the path as the client wrote it, for error messages


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
    ) -> None:
        if batch_window_s < 0:
            raise ValueError(f"batch_window_s must be >= 0, got {batch_window_s}")
        self.model = model
        self.decoder = build_decoder(model, decoder, dtype=dtype)
        device = next(model.parameters()).device
        generator = torch.Generator(device=device).manual_seed(seed)
        self.batcher = ContinuousBatcher(
            self.decoder, pad_token_id, max_rows=max_rows, generator=generator, device=device
        )
        self.batch_window_s = batch_window_s
        self.weight_version = 0
        self.started_at = time.time()
        self._inbox: queue.Queue[_Generate | _UpdateWeights | _Cancel] = queue.Queue()
        self._futures: dict[int, Future] = {}  # batcher handle → its future
        self._handles: dict[Future, int] = {}  # the reverse, for cancellation
        self._updates: deque[_UpdateWeights] = deque()
        self._deferred: deque[_Generate] = deque()  # arrived while an update waits for the batch to drain
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
        waiting = [item.future for item in self._deferred] + [item.future for item in self._updates]
        while not self._inbox.empty():
            item = self._inbox.get_nowait()
            if not isinstance(item, _Cancel):
                waiting.append(item.future)
        self._fail(list(self._futures.values()) + waiting, ShuttingDown("the server is shutting down"))

    def submit(self, request: GenRequest) -> Future:
        """Queue a request; the future resolves to its ``n`` :class:`SampleOutput` s."""
        future: Future = Future()
        self._inbox.put(_Generate(request, future))
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

    def update_weights_from_disk(self, path: str | os.PathLike, given: str | None = None) -> Future:
        """Queue a weight reload from an HF folder; the future resolves to the tensors copied.

        ``path`` must already be checked against the server's weights root (see
        :func:`~hybridflow.inference.weights.folder_under_root`); ``given`` is what the client
        sent, used in error messages instead of the resolved path.
        """
        future: Future = Future()
        self._inbox.put(_UpdateWeights(os.fspath(path), future, given))
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
            "uptime_s": round(time.time() - self.started_at, 3),
        }

    # ---- the engine thread ---------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                if self._updates and self.batcher.idle:
                    self._apply_updates()
                self._collect(block=self.batcher.idle and not self._deferred)
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
            elif isinstance(item, _UpdateWeights):
                self._updates.append(item)
            elif self._updates:
                self._deferred.append(item)
            else:
                self._admit(item)

    def _admit(self, item: _Generate) -> None:
        if not item.future.set_running_or_notify_cancel():
            return  # the client went away before we started
        try:
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
                logger.error("request %d failed alone: %s: %s", handle, type(result).__name__, result,
                             exc_info=result)
                future.set_exception(result)
            else:
                # Weights are swapped only while the batcher is idle, so the version now is the
                # one that produced every token of this request (the first and the last).
                for out in result:
                    out.weight_version = self.weight_version
                future.set_result(result)

    def _abort_running(self, err: Exception) -> None:
        with self._stats_lock:
            handles = self.batcher.abort_running()
        futures = [self._futures.pop(h) for h in handles if h in self._futures]
        for future in futures:
            self._handles.pop(future, None)
        self._fail(futures, err)

    def _apply_updates(self) -> None:
        while self._updates:
            update = self._updates.popleft()
            if not update.future.set_running_or_notify_cancel():
                continue
            try:
                copied = load_weights_from_folder(self.model, update.path, update.given)
            except Exception as err:  # noqa: BLE001 - a bad folder (WeightsRejected) or a failed copy
                if not isinstance(err, WeightsRejected):
                    logger.exception("weight update from %s failed", update.path)
                update.future.set_exception(err)
                continue
            self.decoder.invalidate_weights()
            self.weight_version += 1
            update.future.set_result(copied)
        while self._deferred:
            self._admit(self._deferred.popleft())

    @staticmethod
    def _fail(futures: list[Future], err: Exception) -> None:
        for future in futures:
            if not future.done():
                future.set_exception(err)
