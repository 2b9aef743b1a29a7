"""What the vLLM and SGLang adapters share (the engines differ, the protocol's semantics do not).

* :class:`RequestGate` — admission and in-flight bookkeeping. A request waits (it does not
  fail) while the server is paused (``abort_all`` until ``resume_generation``), asleep, or
  busy with a control call; a control call (sleep, weight update, cache clear) holds new
  requests and waits for the running ones to finish first.
* :class:`GatedAdapter` — the protocol calls both adapters answer the same way.
* :class:`EngineLoop` / :func:`on_engine_loop` — the engine's async state (vLLM's output
  handler, SGLang's response loop, the gate's events) binds to the loop of its first use, so
  each adapter keeps a private event loop on a daemon thread and runs every protocol call
  there; callers may await from any loop (one ``asyncio.run`` per test included).
* :func:`served_tensor_shapes` / :func:`check_named_tensors` — an update is checked in full
  (names and shapes against the model folder, finite values) before anything reaches the
  engine, so a bad update leaves the old weights serving.
"""

from __future__ import annotations

import asyncio
import functools
import json
import threading
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hybridflow.utils.booleans import parse_bool

if TYPE_CHECKING:  # keeps this module importable without torch
    import torch

TIED_HEAD, TIED_EMBEDDING = "lm_head.weight", "model.embed_tokens.weight"


def check_counts(max_tokens: int, logprobs: int, prompt_logprobs: int | None) -> None:
    if max_tokens < 0 or logprobs < 0 or (prompt_logprobs is not None and prompt_logprobs < 0):
        raise ValueError(
            f"max_tokens, logprobs and prompt_logprobs must be >= 0, got {max_tokens}, {logprobs}, {prompt_logprobs}"
        )


def without_first(entries: list[Any], prompt_len: int) -> list[Any]:
    """Per-position prompt entries for positions 1 … n−1: engines put an empty (None) entry
    first for the token without context; drop it when it is there."""
    if len(entries) == prompt_len:
        return entries[1:]
    if len(entries) == prompt_len - 1:
        return entries
    raise RuntimeError(f"the engine returned {len(entries)} prompt log-prob entries for a prompt of {prompt_len}")


class EngineLoop:
    """A private event loop on a daemon thread, where an adapter's engine lives."""

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, Any]) -> Any:
        """Run ``coro`` there and wait for it, from a thread that is not the loop's own."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    async def call(self, coro: Coroutine[Any, Any, Any]) -> Any:
        """Await ``coro`` run there; cancelling the caller cancels it there too."""
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, self.loop))

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=10)
        if not self._thread.is_alive():
            self.loop.close()


def on_engine_loop(method: Callable[..., Coroutine[Any, Any, Any]]) -> Callable[..., Coroutine[Any, Any, Any]]:
    """Run an adapter's coroutine method on its :class:`EngineLoop` (``self._loop``)."""

    @functools.wraps(method)
    async def hop(self: Any, *args: Any, **kwargs: Any) -> Any:
        return await self._loop.call(method(self, *args, **kwargs))

    return hop


@dataclass
class InFlight:
    """One request inside the engine; ``engine_id`` is unique (protocol ids name trajectories,
    which may have several requests at once)."""

    engine_id: str
    aborted: bool = False
    done: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[Any] | None = None


class RequestGate:
    """Who may enter the engine, and who is in it. Single event loop; no locks needed for
    the bookkeeping itself because nothing awaits between a check and its update."""

    def __init__(self) -> None:
        self.paused = False  # abort_all … resume_generation
        self.asleep: set[str] = set()  # released tags ("weights", "kv_cache")
        self._held = False  # a control call is running
        self._open = asyncio.Event()
        self._open.set()
        self._idle = asyncio.Event()
        self._idle.set()
        self.inflight: dict[str, InFlight] = {}
        self.control = asyncio.Lock()  # one control call at a time

    def pause(self) -> list[InFlight]:
        """Hold new requests (until :meth:`resume`) and mark the running ones aborted."""
        self.paused = True
        self.refresh()
        victims = list(self.inflight.values())
        for flight in victims:
            flight.aborted = True
        return victims

    def resume(self) -> None:
        self.paused = False
        self.refresh()

    def refresh(self) -> None:
        if self.paused or self._held or self.asleep:
            self._open.clear()
        else:
            self._open.set()

    async def enter(self, engine_id: str) -> InFlight:
        # Re-check after every wake-up: another state change may have closed the gate again.
        while not self._open.is_set():
            await self._open.wait()
        flight = InFlight(engine_id)
        self.inflight[engine_id] = flight
        self._idle.clear()
        return flight

    def leave(self, flight: InFlight) -> None:
        self.inflight.pop(flight.engine_id, None)
        flight.done.set()
        if not self.inflight:
            self._idle.set()

    @asynccontextmanager
    async def exclusive(self) -> Any:
        """Hold new requests and let the running ones finish, for the body's duration."""
        async with self.control:
            self._held = True
            self.refresh()
            try:
                await self._idle.wait()
                yield
            finally:
                self._held = False
                self.refresh()

    async def wait_aborted(
        self, victims: list[InFlight], resend: Callable[[list[str]], Awaitable[None]], timeout_s: float = 30.0
    ) -> None:
        """Wait until ``victims`` have returned, calling ``resend(ids)`` every 0.1 s for the
        rest: a request that had not yet reached the engine misses the first abort."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            left = [v for v in victims if not v.done.is_set()]
            if not left or loop.time() > deadline:
                return
            waiters = [asyncio.ensure_future(v.done.wait()) for v in left]
            try:
                await asyncio.wait(waiters, timeout=0.1)
            finally:
                for waiter in waiters:
                    waiter.cancel()
            left = [v for v in left if not v.done.is_set()]
            if left:
                await resend([v.engine_id for v in left])


class GatedAdapter:
    """What the vLLM and SGLang adapters answer alike: re-opening admission, the weight version,
    shutting down. A subclass sets ``_loop`` (:class:`EngineLoop`), ``_engine``, ``_gate``
    (:class:`RequestGate`) and ``_version`` (the version of the last weight update)."""

    _loop: EngineLoop
    _engine: Any
    _gate: RequestGate
    _version: int

    @on_engine_loop
    async def resume_generation(self) -> None:
        self._gate.resume()

    @on_engine_loop
    async def get_weight_version(self) -> int:
        return self._version

    def shutdown(self) -> None:
        """Stop the engine's processes and loop (the adapter is unusable afterwards)."""
        getattr(self._engine, "shutdown", lambda: None)()
        self._loop.close()


def served_tensor_shapes(model_path: str | Path) -> dict[str, tuple[int, ...]] | None:
    """``state_dict`` name → shape of the model in the HF folder ``model_path`` (from the
    safetensors headers; nothing is loaded); None when it is not a local folder. A tied LM head
    (absent from the files, present in the trainer's ``state_dict``) is added."""
    folder = Path(model_path)
    files = sorted(folder.glob("*.safetensors")) if folder.is_dir() else []
    if not files:
        return None
    from safetensors import safe_open

    shapes: dict[str, tuple[int, ...]] = {}
    for file in files:
        with safe_open(str(file), framework="pt") as fh:
            for name in fh.keys():  # noqa: SIM118 - safe_open objects are not iterable
                shapes[name] = tuple(fh.get_slice(name).get_shape())
    config = folder / "config.json"
    tied = config.is_file() and parse_bool(
        json.loads(config.read_text()).get("tie_word_embeddings", False), f"{config}: tie_word_embeddings"
    )
    if tied and TIED_HEAD not in shapes and TIED_EMBEDDING in shapes:
        shapes[TIED_HEAD] = shapes[TIED_EMBEDDING]
    return shapes


def check_named_tensors(
    named_tensors: Iterable[tuple[str, torch.Tensor]] | Any,
    shapes: dict[str, tuple[int, ...]] | None,
    *,
    served_dtype: torch.dtype | None = None,
    require_all: bool = False,
) -> list[tuple[str, torch.Tensor]]:
    """The update as a list, checked in full: every name known, every shape right, every value
    finite (also after the cast to ``served_dtype``: 1e39 is inf in bf16), and with
    ``require_all`` (the weights were freed by a level-2 sleep) every tensor present.
    Raises :class:`~hybridflow.inference.weights.WeightsRejected` (a ``ValueError``)."""
    import torch

    from hybridflow.inference.weights import WeightsRejected

    pairs = list(named_tensors.items() if hasattr(named_tensors, "items") else named_tensors)
    for name, tensor in pairs:
        if shapes is not None:
            if name not in shapes:
                raise WeightsRejected(f"update_weights: the served model has no tensor named {name!r}")
            if tuple(tensor.shape) != shapes[name]:
                raise WeightsRejected(
                    f"update_weights: {name!r} has shape {tuple(tensor.shape)}, the served model expects {shapes[name]}"
                )
        if tensor.is_floating_point():
            cast = tensor if served_dtype is None else tensor.detach().to(served_dtype)
            if not bool(torch.isfinite(cast).all()):
                raise WeightsRejected(f"update_weights: {name!r} holds NaN or inf (in {cast.dtype})")
    if require_all and shapes is not None:
        given = {name for name, _ in pairs}
        missing = [n for n in shapes if n not in given and not (n == TIED_HEAD and TIED_EMBEDDING in given)]
        if missing:
            raise WeightsRejected(
                f"update_weights: the weights were freed, so every tensor must be sent; missing {missing[:5]}"
            )
    return pairs
