"""The engine thread's side of the generation engine: the loop that feeds the batcher and steps it.

:class:`BatchingLoop` holds the state of a
:class:`~hybridflow.inference.generation_engine.GenerationEngine` and runs on its thread; the
engine adds the methods other threads call, which only put items
(:mod:`hybridflow.inference.engine_queue`) in the inbox. Only this thread ever touches the batcher.

Controls that must not cut into a forward — a weight update, ``sleep``, ``clear_kv_cache`` —
wait until the running requests are done ("barriers"; requests that arrive meanwhile are
held). ``abort_all`` acts at once: every request in flight is answered with its tokens so far
(``finish_reason="abort"``) and admission stays closed until ``resume_generation``. A sleeping
engine holds new requests until it is woken. Weights are swapped only while the batcher is
idle, so no response ever mixes two weight versions.

Failures are kept as small as they can be: a request that fails alone (see
:class:`~hybridflow.inference.continuous.ContinuousBatcher`) gets its exception and the
batch goes on; a failed forward fails the requests in that forward; anything else that goes
wrong in the loop fails what is in flight and the loop carries on. The thread never dies
while the server runs, so no future is left unanswered.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque
from concurrent.futures import Future
from typing import Any

import torch
from torch import nn

from hybridflow.inference.batcher_types import SampleOutput
from hybridflow.inference.continuous import ContinuousBatcher
from hybridflow.inference.engine_queue import (
    BarrierItem,
    CancelItem,
    ControlItem,
    GenerateItem,
    GenerationFailed,
    RequestCancelled,
    RequestRefused,
    ScoreItem,
    UpdateWeightsItem,
)
from hybridflow.inference.generation import Decoder
from hybridflow.inference.prompt_scoring import prompt_log_probs
from hybridflow.inference.weights import (
    WeightsRejected,
    free_parameters,
    load_weights_from_folder,
    restore_parameters,
)

logger = logging.getLogger("hybridflow.server")

_IDLE_POLL_S = 0.05  # how often an idle engine thread looks at the stop flag


class BatchingLoop:
    """The state of an engine and what its thread does with it: collect the inbox, admit
    requests into the batcher, step it, resolve futures, apply barriers and controls.

    ``batch_window_s``: an idle loop waits that long after the first request for others to
    arrive, so a burst starts as one prefill instead of joining step by step (0 = start at once).
    """

    def __init__(self, model: nn.Module, decoder: Decoder, batcher: ContinuousBatcher, batch_window_s: float) -> None:
        self.model = model
        self.decoder = decoder
        self.batcher = batcher
        self.batch_window_s = batch_window_s
        self.weight_version = 0
        self._inbox: queue.Queue[Any] = queue.Queue()
        self._futures: dict[int, Future] = {}  # batcher handle → its future
        self._handles: dict[Future, int] = {}  # the reverse, for cancellation
        self._prompt_scores: dict[Future, tuple[list[float], list | None]] = {}
        self._barriers: deque[UpdateWeightsItem | BarrierItem] = deque()
        self._deferred: deque[GenerateItem | ScoreItem] = deque()  # held: a barrier waits, paused, or asleep
        self.paused = False  # abort_all() closed admission until resume_generation()
        self.sleep_level = 0  # 0 awake; 1 KV cache freed; 2 weights freed too
        self._freed: dict[str, tuple[torch.Size, torch.dtype]] | None = None  # level-2 shapes
        self.weights_discarded = False  # freed and re-allocated but not yet reloaded
        self._stats_lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="hybridflow-engine", daemon=True)

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
            if isinstance(item, CancelItem):
                self._cancel(item.future)
            elif isinstance(item, ControlItem):
                self._apply_control(item)
            elif isinstance(item, (UpdateWeightsItem, BarrierItem)):
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

    def _admit(self, item: GenerateItem | ScoreItem) -> None:
        if not item.future.set_running_or_notify_cancel():
            return  # the client went away before we started
        if self.weights_discarded:
            item.future.set_exception(
                RequestRefused(
                    "the weights were freed by sleep(level=2) and not reloaded: push them with update_weights first"
                )
            )
            return
        try:
            if isinstance(item, ScoreItem):
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
                logger.error("request %d failed alone: %s: %s", handle, type(result).__name__, result, exc_info=result)
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

    def _apply_control(self, item: ControlItem) -> None:
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
                if isinstance(item, ScoreItem):
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
                result = self._update(item) if isinstance(item, UpdateWeightsItem) else self._barrier(item)
            except Exception as err:  # noqa: BLE001 - a bad folder (WeightsRejected) or a failed copy
                if not isinstance(err, WeightsRejected):
                    logger.exception("%s failed", type(item).__name__)
                item.future.set_exception(err)
                continue
            item.future.set_result(result)
        self._release_deferred()

    def _update(self, update: UpdateWeightsItem) -> int:
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

    def _barrier(self, item: BarrierItem) -> int:
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
