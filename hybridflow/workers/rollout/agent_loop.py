"""``AgentLoopRollout`` (registry name ``"agent_loop"``): generation through the agent loops.

Chosen by ``actor_rollout_ref.rollout.multi_turn.enable=true`` (the rollout worker swaps the
built-in ``torch`` rollout for this one) or by name. It is a :class:`TorchRollout` whose
``generate_sequences`` runs each prompt row's agent loop (its ``agent_name`` column, default
``rollout.agent.default_agent_loop``) instead of one plain generation; a batch with neither
``multi_turn.enable`` nor an ``agent_name`` column takes the plain path.

The loops talk to an :class:`~hybridflow.inference.client.InProcessClient` on a
:class:`~hybridflow.inference.generation_engine.GenerationEngine` built on the rollout's module for the
call and shut down after it, so every call samples from the current weights: the actor's live
module when colocated, or the copy :meth:`update_weights` refreshed. All rows run
concurrently on one event loop, so their requests share the engine's forward passes.

Rows with images (a non-empty ``multi_modal_inputs``) whose loop is ``single_turn_agent`` are
answered by the plain image-taking sampler (:class:`TorchRollout`; the single-turn loop is
token for token the plain rollout), with the agent columns of a single-turn trajectory; the
agent engine takes token ids only, so any other loop, and partial rollout, refuse image rows
with a clear error.

Output: verl's fields as collated by :func:`hybridflow.agent.collate.collate_trajectories`
(``response_mask`` 0 on tool / separator tokens), the agent columns (``__num_turns__``,
``tool_call_counts``, ``turn_scores``, ``tool_rewards``); the metrics (``num_turns/*``,
``tool_call_counts/*``, ``agent_loop/*``) come next to the data from
:meth:`~hybridflow.workers.rollout.base.BaseRollout.generate_with_metrics`.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import TimeoutError as FutureTimeout
from contextlib import AbstractContextManager
from typing import Any, ClassVar

import numpy as np
import torch
from torch import nn

from hybridflow import fields as F
from hybridflow.agent.base import AgentContext, agent_loop_table, has_images
from hybridflow.agent.collate import NUM_TURNS, TOOL_CALL_COUNTS, TOOL_REWARDS, TURN_SCORES
from hybridflow.agent.runner import AGENT_NAME, DEFAULT_AGENT_LOOP, run_agent_loops
from hybridflow.config.actor_rollout_ref import RolloutConfig
from hybridflow.fields import EXTRA_INFO
from hybridflow.inference.client import InProcessClient
from hybridflow.inference.engine_queue import ShuttingDown
from hybridflow.inference.generation_engine import GenerationEngine
from hybridflow.inference.partial_rollout import PartialRolloutClient
from hybridflow.inference.protocol import SamplingParams
from hybridflow.inference.sampling import GenerationParams
from hybridflow.protocol import DataProto
from hybridflow.protocol.rows import object_array
from hybridflow.tools.registry import build_tools
from hybridflow.utils.async_run import run_coroutine
from hybridflow.workers.rollout.base import ROLLOUTS, RolloutCapabilities, RolloutOutput
from hybridflow.workers.rollout.torch_rollout import (
    TorchRollout,
    _compute_dtype,
    pad_token_id,
)

TOOLS_KWARGS = "tools_kwargs"


def _with_tools_kwargs(prompts: DataProto) -> DataProto:
    """``prompts`` with a ``tools_kwargs`` column taken from ``extra_info["tools_kwargs"]``
    (where verl's datasets keep it) when the batch has none; the input is not changed."""
    columns = prompts.non_tensor_batch
    if TOOLS_KWARGS in columns or EXTRA_INFO not in columns:
        return prompts
    values = [info.get(TOOLS_KWARGS) if isinstance(info, dict) else None for info in columns[EXTRA_INFO]]
    if all(v is None for v in values):
        return prompts
    column = np.empty(len(values), dtype=object)
    column[:] = values
    return DataProto(
        batch=prompts.batch, non_tensor_batch={**columns, TOOLS_KWARGS: column}, meta_info=prompts.meta_info
    )


class AgentLoops:
    """The agent-loop side of a rollout, whatever engine answers: the tool set, the loop table
    and the run of one batch through its rows' loops against a
    :class:`~hybridflow.inference.protocol.TokenClient`. Shared by :class:`AgentLoopRollout`
    (the in-process engine) and :class:`~hybridflow.workers.rollout.server_rollout.ServerRollout`
    (a server: ``hybridflow serve``, vLLM, SGLang)."""

    def __init__(self, config: RolloutConfig, tokenizer: Any) -> None:
        if tokenizer is None:
            raise ValueError("the agent loop needs the model's tokenizer (chat template)")
        self.config = config
        self.tokenizer = tokenizer
        mt, agent = config.multi_turn, config.agent
        self.tools = build_tools(tool_config_path=mt.tool_config_path, function_tool_path=mt.function_tool_path)
        self.table = agent_loop_table(
            agent.agent_loop_config_path,
            builtin_kwargs={
                "tool_agent": {
                    "max_assistant_turns": mt.max_assistant_turns,
                    "max_user_turns": mt.max_user_turns,
                    "max_parallel_calls": mt.max_parallel_calls,
                    "max_tool_response_length": mt.max_tool_response_length,
                    "tool_response_truncate_side": mt.tool_response_truncate_side,
                    "format": mt.format,
                }
            },
        )
        self.default_agent_loop = agent.default_agent_loop
        self.table.get(self.default_agent_loop)  # an unknown default fails at start-up, listing the loops

    def client_sampling(self, params: GenerationParams, seed: int) -> SamplingParams:
        """The protocol's settings for a batch; seeded: row i, turn t sample from (seed, i, t)."""
        if params.n != 1:
            raise ValueError(
                f"the agent loop answers each row once (meta_info['n']={params.n}); repeat the rows instead "
                "(the trainer does: rollout.n interleaved copies)"
            )
        greedy = not params.do_sample or params.temperature == 0
        return SamplingParams(
            temperature=0.0 if greedy else params.temperature,
            top_p=params.top_p,
            top_k=params.top_k,
            seed=seed,
        )

    def run(
        self, prompts: DataProto, client: Any, params: GenerationParams, *, seed: int, pad: int, prompt_length: int
    ) -> RolloutOutput:
        """Every row through its loop, concurrently, on ``client``; verl's fields collated, and
        the loops' metrics."""
        meta = prompts.meta_info
        context = AgentContext(
            client=client,
            tokenizer=self.tokenizer,
            response_length=params.max_new_tokens,
            tools=self.tools,
            chat_template_kwargs=dict(meta.get(F.META_CHAT_TEMPLATE_KWARGS) or {}),
        )
        out = run_coroutine(
            run_agent_loops(
                _with_tools_kwargs(prompts),
                table=self.table,
                context=context,
                sampling=self.client_sampling(params, seed),
                prompt_length=prompt_length,
                pad_token_id=pad,
                default_agent_loop=self.default_agent_loop,
            )
        )
        device = prompts.batch["input_ids"].device if prompts.batch is not None else torch.device("cpu")
        metrics = out.meta_info.pop(F.META_METRICS, None) or {}  # the collate's hand-over: a value from here on
        return RolloutOutput(out.to(device), metrics)


def image_rows(prompts: DataProto) -> bool:
    """Whether some row of ``prompts`` carries image inputs."""
    column = prompts.non_tensor_batch.get(F.MULTI_MODAL_INPUTS)
    return column is not None and any(has_images({F.MULTI_MODAL_INPUTS: row}) for row in column)


def batch_seed(meta: dict[str, Any], generator: torch.Generator) -> int:
    """The call's seed: ``meta_info['seed']`` (the trainer's per-step seed), else the rollout's."""
    return int(meta[F.META_SEED]) if F.META_SEED in meta else int(generator.initial_seed())


@ROLLOUTS.register("agent_loop")
class AgentLoopRollout(TorchRollout):
    """See the module docstring. Arguments as :class:`TorchRollout`."""

    capabilities: ClassVar[RolloutCapabilities] = RolloutCapabilities(
        partial_rollout=True, sleep_wake=True, weight_version=True, swap_lock=True
    )

    def __init__(
        self,
        config: RolloutConfig,
        model: nn.Module,
        tokenizer: Any = None,
        *,
        dtype: torch.dtype | str | None = None,
        decoder: str = "auto",
        weight_format: str = "auto",
    ) -> None:
        super().__init__(config, model, tokenizer, dtype=dtype, decoder=decoder, weight_format=weight_format)
        self.loops = AgentLoops(config, tokenizer)
        self.engine_decoder = decoder
        self.engine_dtype = _compute_dtype(dtype)
        self.enabled = bool(config.multi_turn.enable)
        # Partial rollout (asynchronous training): the engine of the call in flight can be
        # aborted, given new weights while paused, and resumed; the loops resubmit what was cut.
        self.partial_rollout = False
        self.weight_version = 0
        self._swap_lock = threading.RLock()  # engine creation vs. a weight swap and its version
        self.live_engine: GenerationEngine | None = None

    def uses_agent_loop(self, prompts: DataProto) -> bool:
        """True when this batch goes through the agent loops (always with partial rollout:
        only the engine behind them can be aborted and resumed)."""
        return self.partial_rollout or self.enabled or AGENT_NAME in prompts.non_tensor_batch

    @property
    def swap_lock(self) -> AbstractContextManager[Any]:
        return self._swap_lock

    def set_partial_rollout(self, enabled: bool) -> None:
        self.partial_rollout = bool(enabled)

    def generate_sequences(self, prompts: DataProto) -> DataProto:
        return self.generate_with_metrics(prompts).data

    def generate_with_metrics(self, prompts: DataProto) -> RolloutOutput:
        if not self.uses_agent_loop(prompts):
            return RolloutOutput(super().generate_sequences(prompts), {})
        if image_rows(prompts):
            return self._single_turn_images(prompts)
        meta = dict(prompts.meta_info)
        params = self.sampling_params(meta)
        pad = pad_token_id(meta, self.default_pad)
        width = prompts.batch["input_ids"].shape[1] if prompts.batch is not None else 0
        self._check_lengths(width, params.max_new_tokens)
        seed = batch_seed(meta, self.generator)
        stops = () if params.ignore_eos else params.stop_token_ids
        with self.swap_lock:
            engine = GenerationEngine(
                self.model,
                pad,
                decoder=self.engine_decoder,
                dtype=self.engine_dtype,
                max_rows=max(1, len(prompts)),
                seed=seed,
            )
            engine.weight_version = self.weight_version
            engine.start()
            self.live_engine = engine
        client = InProcessClient(engine, stop_token_ids=stops)
        try:
            return self.loops.run(
                prompts,
                PartialRolloutClient(client) if self.partial_rollout else client,
                params,
                seed=seed,
                pad=pad,
                prompt_length=self.config.prompt_length or width,
            )
        finally:
            with self.swap_lock:
                self.live_engine = None
            engine.shutdown()

    def _single_turn_images(self, prompts: DataProto) -> RolloutOutput:
        """Image rows of ``single_turn_agent``: the plain sampler (which takes their pixels) and
        the agent columns of one-turn trajectories (2 turns, no tool calls)."""
        names = prompts.non_tensor_batch.get(AGENT_NAME)
        loops = {str(name or self.loops.default_agent_loop) for name in names} if names is not None else set()
        loops = loops or {self.loops.default_agent_loop}
        if self.partial_rollout or loops != {DEFAULT_AGENT_LOOP}:
            what = (
                "partial rollout" if self.partial_rollout else f"agent loop(s) {sorted(loops - {DEFAULT_AGENT_LOOP})}"
            )
            raise ValueError(
                f"{what} cannot take rows with images yet: the agent engine generates from token ids only; "
                f"image rows are supported by {DEFAULT_AGENT_LOOP} on the built-in rollout (docs/vision.md)"
            )
        out = super().generate_sequences(prompts)
        rows = len(out)
        out.non_tensor_batch[NUM_TURNS] = np.full(rows, 2, dtype=np.int32)
        out.non_tensor_batch[TOOL_CALL_COUNTS] = np.zeros(rows, dtype=np.int64)
        out.non_tensor_batch[TURN_SCORES] = object_array([[] for _ in range(rows)])
        out.non_tensor_batch[TOOL_REWARDS] = object_array([[] for _ in range(rows)])
        out.non_tensor_batch[F.WEIGHT_VERSION_MIN] = np.full(rows, self.weight_version, dtype=np.int64)
        out.non_tensor_batch[F.WEIGHT_VERSION_MAX] = np.full(rows, self.weight_version, dtype=np.int64)
        metrics = {f"{name}/{stat}": value for name, value in (("num_turns", 2.0), ("tool_call_counts", 0.0))
                   for stat in ("min", "max", "mean")}  # fmt: skip
        return RolloutOutput(out, metrics)

    def abort_generation(self) -> int:
        """Abort the requests of the call in flight (they hand back their tokens and are
        resubmitted, held until :meth:`resume_generation`); the number aborted, 0 if none."""
        with self.swap_lock:
            engine = self.live_engine
            return _wait(engine.abort_all(), engine) if engine is not None else 0

    def resume_generation(self) -> None:
        with self.swap_lock:
            if self.live_engine is not None:
                _wait(self.live_engine.resume_generation(), self.live_engine)

    def weights_changed(self) -> None:
        super().weights_changed()
        with self.swap_lock:
            if self.live_engine is not None:
                self.live_engine.decoder.invalidate_weights()

    def set_weight_version(self, version: int) -> None:
        """The version of the module's weights now (the live engine stamps it on new tokens)."""
        with self.swap_lock:
            self.weight_version = int(version)
            if self.live_engine is not None:
                self.live_engine.weight_version = int(version)


def _wait(future: Any, engine: GenerationEngine, timeout_s: float = 600.0) -> Any:
    """The engine control's result; None if the engine stopped first (its call had finished)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return future.result(timeout=0.05)
        except FutureTimeout:
            if not engine.alive or time.monotonic() > deadline:
                return 0
        except ShuttingDown:
            return 0
