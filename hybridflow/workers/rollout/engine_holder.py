"""The rollout's one generation engine: created on first use, kept for the rollout's life.

:class:`~hybridflow.workers.rollout.agent_loop.AgentLoopRollout` answers agent-loop batches on a
:class:`~hybridflow.inference.generation_engine.GenerationEngine`. Building one per call cost a
decoder (and, on the packed path, a re-pack of every projection) and a thread start per call;
:class:`EngineHolder` keeps one instead:

* **Created lazily, started once.** The first agent-loop call builds it on the rollout's own
  decoder, so the engine and the plain sampler share one packed copy of the weights; the
  decoder re-packs a projection only when its parameters changed (version counters, optimizer
  steps; :mod:`hybridflow.inference.projections`), or after :meth:`weights_changed` /
  ``release``. So weights are re-packed only when they change.
* **Per-call settings stay per call.** Seeds, stop ids and sampling settings travel with each
  request; the pad id only fills masked cache columns (the collated output uses the call's own);
  the row bound grows to the largest batch seen (:meth:`GenerationEngine.reserve_rows`).
* **One forward at a time on the shared decoder.** Agent-loop calls may overlap one another
  (their requests share the engine's forwards); a plain-sampler call waits until none is in
  flight, and agent calls wait while it runs (:meth:`agent_call` / :meth:`plain_call`).
* **Partial rollout.** :meth:`abort` aborts the requests of the calls in flight (0 when none
  is); the engine holds their resubmissions until :meth:`resume`.
* **Closed with the rollout.** :meth:`close` stops the engine thread; a later call starts a
  fresh engine.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent.futures import TimeoutError as FutureTimeout
from contextlib import contextmanager
from typing import Any

from torch import nn

from hybridflow.inference.engine_queue import ShuttingDown
from hybridflow.inference.generation import Decoder
from hybridflow.inference.generation_engine import GenerationEngine


class EngineHolder:
    """See the module docstring. ``swap_lock`` is the rollout's: engine creation and the
    version stamp happen under it, as a weight swap does."""

    def __init__(self, model: nn.Module, decoder: Decoder, swap_lock: Any, *, seed: int = 0) -> None:
        self.model = model
        self.decoder = decoder
        self.seed = seed
        self.swap_lock = swap_lock
        self.weight_version = 0
        self.engine: GenerationEngine | None = None
        self.engines_built = 0  # for tests and benchmarks: 1 over a rollout's life
        self._paths = threading.Condition()
        self._agent_calls = 0
        self._plain = False

    @property
    def live(self) -> GenerationEngine | None:
        """The engine while an agent-loop call is in flight, else None."""
        return self.engine if self._agent_calls else None

    def _started(self, pad_token_id: int) -> GenerationEngine:
        with self.swap_lock:
            if self.engine is None or not self.engine.alive:
                engine = GenerationEngine(self.model, pad_token_id, decoder=self.decoder, max_rows=1, seed=self.seed)
                engine.start()
                self.engine = engine
                self.engines_built += 1
            self.engine.weight_version = self.weight_version
            return self.engine

    @contextmanager
    def agent_call(self, rows: int, pad_token_id: int) -> Iterator[GenerationEngine]:
        """The started engine, room for ``rows`` rows in one forward, for one agent-loop call."""
        with self._paths:
            self._paths.wait_for(lambda: not self._plain)
            self._agent_calls += 1
        try:
            engine = self._started(pad_token_id)
            engine.reserve_rows(max(1, rows))
            yield engine
        finally:
            with self._paths:
                self._agent_calls -= 1
                self._paths.notify_all()

    @contextmanager
    def plain_call(self) -> Iterator[None]:
        """Hold off agent-loop calls while the plain sampler steps the shared decoder."""
        with self._paths:
            self._paths.wait_for(lambda: not self._plain and not self._agent_calls)
            self._plain = True
        try:
            yield
        finally:
            with self._paths:
                self._plain = False
                self._paths.notify_all()

    def abort(self) -> int:
        """Abort the requests in flight (they hand back their tokens; resubmissions wait for
        :meth:`resume`); the number aborted, 0 when no call is in flight."""
        with self.swap_lock:
            engine = self.live
            return _wait(engine.abort_all(), engine) if engine is not None else 0

    def resume(self) -> None:
        with self.swap_lock:
            if self.engine is not None and self.engine.alive:
                _wait(self.engine.resume_generation(), self.engine)

    def set_weight_version(self, version: int) -> None:
        """The version of the module's weights now (the engine stamps it on new tokens)."""
        with self.swap_lock:
            self.weight_version = int(version)
            if self.engine is not None:
                self.engine.weight_version = int(version)

    def close(self) -> None:
        """Stop the engine thread (requests still in flight fail with ``ShuttingDown``)."""
        with self.swap_lock:
            engine, self.engine = self.engine, None
        if engine is not None:
            engine.shutdown()


def _wait(future: Any, engine: GenerationEngine, timeout_s: float = 600.0) -> Any:
    """The engine control's result; 0 if the engine stopped first."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return future.result(timeout=0.05)
        except FutureTimeout:
            if not engine.alive or time.monotonic() > deadline:
                return 0
        except ShuttingDown:
            return 0
