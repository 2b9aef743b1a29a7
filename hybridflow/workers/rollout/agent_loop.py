"""``AgentLoopRollout`` (registry name ``"agent_loop"``): generation through the agent loops.

Chosen by ``actor_rollout_ref.rollout.multi_turn.enable=true`` (the rollout worker swaps the
built-in ``torch`` rollout for this one) or by name. It is a :class:`TorchRollout` whose
``generate_sequences`` runs each prompt row's agent loop (its ``agent_name`` column, default
``rollout.agent.default_agent_loop``) instead of one plain generation; a batch with neither
``multi_turn.enable`` nor an ``agent_name`` column takes the plain path.

The loops talk to an :class:`~hybridflow.inference.client.InProcessClient` on the rollout's one
:class:`~hybridflow.inference.generation_engine.GenerationEngine`
(:class:`~hybridflow.workers.rollout.engine_holder.EngineHolder`: built on first use on the
rollout's own decoder, started once, stopped by :meth:`AgentLoopRollout.close`). The decoder
re-packs weights only when they changed, so every call samples from the current weights: the
actor's live module when colocated, or the copy :meth:`update_weights` refreshed. All rows run
concurrently on one event loop, so their requests share the engine's forward passes.

Rows with images (a non-empty ``multi_modal_inputs``) go through their loops like text rows: the
loops send each request the row's image inputs and the prompt's 3-D positions
(:mod:`hybridflow.agent.images`), later turns continue the same sequence, and partial rollout
resubmits with the images. The output then has ``position_ids`` (B, 3, P+T) and keeps each row's
``multi_modal_inputs``, as the plain sampler's does.

Output: verl's fields as collated by :func:`hybridflow.agent.collate.collate_trajectories`
(``response_mask`` 0 on tool / separator tokens), the agent columns (``__num_turns__``,
``tool_call_counts``, ``turn_scores``, ``tool_rewards``); the metrics (``num_turns/*``,
``tool_call_counts/*``, ``agent_loop/*``) come next to the data from
:meth:`~hybridflow.workers.rollout.base.BaseRollout.generate_with_metrics`.
"""

from __future__ import annotations

import threading
from contextlib import AbstractContextManager
from typing import Any, ClassVar

import numpy as np
import torch
from torch import nn

from hybridflow import fields as F
from hybridflow.agent.base import AgentContext, agent_loop_table
from hybridflow.agent.images import VisionTokens, vision_tokens
from hybridflow.agent.runner import AGENT_NAME, run_agent_loops
from hybridflow.config.actor_rollout_ref import RolloutConfig
from hybridflow.fields import EXTRA_INFO
from hybridflow.inference.client import InProcessClient
from hybridflow.inference.generation_engine import GenerationEngine
from hybridflow.inference.partial_rollout import PartialRolloutClient
from hybridflow.inference.protocol import SamplingParams
from hybridflow.inference.sampling import GenerationParams
from hybridflow.protocol import DataProto
from hybridflow.tools.registry import build_tools
from hybridflow.utils.async_run import run_coroutine
from hybridflow.workers.rollout.base import ROLLOUTS, RolloutCapabilities, RolloutOutput
from hybridflow.workers.rollout.engine_holder import EngineHolder
from hybridflow.workers.rollout.torch_rollout import TorchRollout, pad_token_id

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
        self,
        prompts: DataProto,
        client: Any,
        params: GenerationParams,
        *,
        seed: int,
        pad: int,
        prompt_length: int,
        vision: VisionTokens | None = None,
    ) -> RolloutOutput:
        """Every row through its loop, concurrently, on ``client``; verl's fields collated, and
        the loops' metrics. ``vision``: the model's vision tokens when ``client`` takes images."""
        meta = prompts.meta_info
        context = AgentContext(
            client=client,
            tokenizer=self.tokenizer,
            response_length=params.max_new_tokens,
            tools=self.tools,
            chat_template_kwargs=dict(meta.get(F.META_CHAT_TEMPLATE_KWARGS) or {}),
            vision=vision,
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
        return RolloutOutput(_positions_like_prompts(out, prompts).to(device), metrics)


def _positions_like_prompts(out: DataProto, prompts: DataProto) -> DataProto:
    """A batch of a multimodal data set holds (B, 3, P) positions even when none of its rows has
    an image; its trajectories then get 3-D positions too (text counts up alike on every axis),
    as the plain sampler's output would."""
    given = (
        prompts.batch[F.POSITION_IDS] if prompts.batch is not None and F.POSITION_IDS in prompts.batch.keys() else None
    )
    batch = out.require_batch()
    positions = batch[F.POSITION_IDS]
    if given is not None and given.dim() == 3 and positions.dim() == 2:
        batch[F.POSITION_IDS] = positions[:, None, :].expand(-1, given.shape[1], -1).clone()
    return out


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
        self.vision = vision_tokens(getattr(model, "config", None))
        self.enabled = bool(config.multi_turn.enable)
        # Partial rollout (asynchronous training): the engine's calls in flight can be aborted,
        # given new weights while paused, and resumed; the loops resubmit what was cut.
        self.partial_rollout = False
        self._swap_lock = threading.RLock()  # engine creation vs. a weight swap and its version
        self.engines = EngineHolder(model, self.decoder, self._swap_lock, seed=int(self.generator.initial_seed()))

    @property
    def weight_version(self) -> int:
        return self.engines.weight_version

    @property
    def live_engine(self) -> GenerationEngine | None:
        """The engine while an agent-loop call is in flight (None otherwise)."""
        return self.engines.live

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
            with self.engines.plain_call():  # the plain sampler steps the decoder the engine shares
                return RolloutOutput(super().generate_sequences(prompts), {})
        meta = dict(prompts.meta_info)
        params = self.sampling_params(meta)
        pad = pad_token_id(meta, self.default_pad)
        width = prompts.batch["input_ids"].shape[1] if prompts.batch is not None else 0
        self._check_lengths(width, params.max_new_tokens)
        seed = batch_seed(meta, self.generator)
        stops = () if params.ignore_eos else params.stop_token_ids
        with self.engines.agent_call(len(prompts), pad) as engine:
            client = InProcessClient(engine, stop_token_ids=stops)
            return self.loops.run(
                prompts,
                PartialRolloutClient(client) if self.partial_rollout else client,
                params,
                seed=seed,
                pad=pad,
                prompt_length=self.config.prompt_length or width,
                vision=self.vision,
            )

    def abort_generation(self) -> int:
        """Abort the requests of the calls in flight (they hand back their tokens and are
        resubmitted, held until :meth:`resume_generation`); the number aborted, 0 if none."""
        return self.engines.abort()

    def resume_generation(self) -> None:
        self.engines.resume()

    def set_weight_version(self, version: int) -> None:
        """The version of the module's weights now (the engine stamps it on new tokens)."""
        self.engines.set_weight_version(version)

    def close(self) -> None:
        """Stop the engine thread (a later call starts a fresh engine)."""
        self.engines.close()
