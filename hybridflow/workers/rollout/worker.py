"""The rollout role: a worker that owns one rollout engine and keeps its weights current.

How the actor's weights reach it is ``rollout.checkpoint_engine.backend`` (a
:mod:`hybridflow.weight_sync` backend):

* ``shared`` — colocated with an unsharded actor, it samples from the actor's live module,
  looked up under ``share_name`` (see :mod:`hybridflow.workers.shared_policy`): no second
  model, no copy; a sync only stamps the version.
* ``inproc`` / ``disk`` — it loads its own copy of ``actor_rollout_ref.model.path`` and
  receives the actor engine's ``iter_sync_weights()`` (LoRA merged, FSDP shards gathered — all
  ranks together) as bucketed in-memory copies or as safetensors files.
* ``http`` — it holds no model: a ``hybridflow serve --control-routes`` process at
  ``engine_kwargs.url`` generates (:class:`~hybridflow.workers.rollout.server_rollout.ServerRollout`)
  and rank 0 posts the weights to it in safetensors buckets.
* ``naive`` (verl's default) — ``shared`` where it can be, else ``inproc`` (a sharded actor).

``rollout.name=vllm|sglang`` generates on that engine's adapter (a ``ServerRollout`` too), built
with the rollout config's engine settings (:mod:`.engine_settings`), and weights go to it bucket
by bucket through its ``update_weights``.

Colocated synchronous training frees the engine's memory for the training phases: the trainer
calls :meth:`RolloutWorker.sleep` after generating and :meth:`RolloutWorker.wake_up` (weights,
then — after the weight push — the KV cache) before the next generation
(``rollout.free_cache_engine``; see docs/rollout.md).

The trainer calls :meth:`RolloutWorker.update_weights` after every actor update with the
global step, which every backend stamps as the rollout's ``weight_version``. The weights are
also pulled before generating whenever the actor engine's ``weights_version`` moved since the
last sync (a resumed checkpoint, the first step) — unless asynchronous training switched that
off (:meth:`RolloutWorker.set_pull_before_generating`).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import torch

from hybridflow import fields as F
from hybridflow.config import ActorRolloutRefConfig
from hybridflow.controller import Dispatch, Worker, register
from hybridflow.controller.dispatch import (
    DispatchContext,
    Dispatched,
    DispatchMode,
    collect_dp_compute_data_proto,
    dispatch_dp_compute_data_proto,
)
from hybridflow.engine.base import TrainEngine
from hybridflow.inference.weight_transfer import NamedTensorPairs, named_pairs
from hybridflow.models import (
    load_model_and_tokenizer,
    load_tokenizer,
    policy_attn_implementation,
    resolve_model_path,
)
from hybridflow.protocol import DataProto
from hybridflow.utils.async_run import run_coroutine
from hybridflow.utils.precision import resolve_compute_dtype
from hybridflow.weight_sync import ModuleTarget, WeightSync, build_weight_sync
from hybridflow.workers.data_parallel import merge_rank_metrics
from hybridflow.workers.rollout.base import (
    ROLLOUTS,
    BaseRollout,
    NamedTensors,
    RolloutOutput,
)
from hybridflow.workers.rollout.engine_settings import engine_args, unread_settings
from hybridflow.workers.shared_policy import (
    DEFAULT_SHARE_NAME,
    SharedPolicy,
    lookup_policy,
)

SERVER_ENGINES = ("vllm", "sglang")
logger = logging.getLogger(__name__)


def resolve_backend(backend: str, shared: SharedPolicy | None) -> str:
    """``naive`` → ``shared`` when an unsharded actor's module is at hand, else ``inproc``."""
    can_share = shared is not None and not shared.engine.shards_parameters
    if backend == "naive":
        return "shared" if can_share else "inproc"
    if backend == "shared" and not can_share:
        why = "no colocated actor in this process" if shared is None else "the actor's module is sharded (FSDP)"
        raise ValueError(
            f"rollout.checkpoint_engine.backend=shared needs the actor's live module, but {why}; use inproc (or naive)"
        )
    return backend


def dispatch_prompts(ctx: DispatchContext, *args: Any, **kwargs: Any) -> Dispatched:
    """The prompts chunked per rank as ``DP_COMPUTE_PROTO`` does, without auto-padding: the
    output pairs the data with metrics, which padding rows would skew."""
    plan = dispatch_dp_compute_data_proto(ctx, *args, **kwargs)
    if plan.pad_size:
        raise ValueError(
            f"generate_sequences does not auto-pad: pad the prompts to a multiple of the {ctx.world_size} "
            "rollout ranks first (pad_dataproto_to_divisor) and drop the padding rows from the output"
        )
    return plan


def collect_rollout_outputs(ctx: DispatchContext, outputs: list[Any]) -> RolloutOutput:
    """The ranks' data concatenated; their metrics as ``{name: [one value per rank]}``."""
    for rank, out in enumerate(outputs):
        if not isinstance(out, RolloutOutput):
            raise TypeError(
                f"generate_sequences must return a RolloutOutput, but rank {rank} returned a {type(out).__name__}"
            )
    return RolloutOutput(
        collect_dp_compute_data_proto(ctx, [out.data for out in outputs]),
        merge_rank_metrics([out.metrics for out in outputs]),
    )


DP_ROLLOUT = DispatchMode(dispatch_fn=dispatch_prompts, collect_fn=collect_rollout_outputs)


_LOADED = torch.empty(0)


class _ServerTarget:
    """An :class:`~hybridflow.inference.protocol.InferenceServer` adapter (vLLM, SGLang) as a
    weight-sync target: each bucket goes to the engine's ``update_weights`` as it is staged
    (these engines load weights in place; the atomic swap is the built-in engine's)."""

    def __init__(self, server: Any) -> None:
        self.server = server
        self.weight_version = 0  # the version being delivered: set by the worker before a sync

    def stage(self, bucket: NamedTensors) -> dict[str, torch.Tensor]:
        pairs = list(named_pairs(bucket))
        run_coroutine(self.server.update_weights(pairs, self.weight_version))
        # Already loaded: the sync only learns the names (an empty result would read as "no tensors").
        return dict.fromkeys((name for name, _ in pairs), _LOADED)

    def swap_in(self, staged: dict[str, torch.Tensor], version: int) -> int:
        self.weight_version = int(version)
        return 0


class RolloutWorker(Worker):
    """Generates responses. Args: the ``actor_rollout_ref`` config; ``device``; ``seed`` (used
    when ``rollout.seed`` is null); ``share_name`` — where the colocated actor published its
    policy in this process (None: no actor here; weights come only through
    :meth:`update_weights` with explicit tensors)."""

    def __init__(
        self,
        config: ActorRolloutRefConfig,
        device: str = "cpu",
        seed: int = 0,
        share_name: str | None = DEFAULT_SHARE_NAME,
    ) -> None:
        super().__init__()
        self.config = config
        self.device = torch.device(device)
        self.seed = seed
        self.share_name = share_name
        self.backend = ""
        self._rollout: BaseRollout | None = None
        self._sync: WeightSync | None = None
        self._source: TrainEngine | None = None  # the colocated actor engine weights come from
        self._synced_engine_version = -1  # the source engine's weights_version at the last sync
        self.weight_version = 0  # the version the rollout serves (the global step of its weights)
        self.last_sync: dict[str, float] = {}
        self.pull_before_generating = True
        self._engine: Any = None  # the vLLM / SGLang adapter (rollout.name=vllm|sglang), for sleep / wake
        self._server_target: _ServerTarget | None = None

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self) -> None:
        """Borrow the colocated actor's module, load an own copy, or connect to a server."""
        model_cfg, rollout_cfg = self.config.model, self.config.rollout
        ce = rollout_cfg.checkpoint_engine
        if rollout_cfg.seed is None:
            rollout_cfg = replace(rollout_cfg, seed=self.seed)
        if self.rank == 0:
            for line in unread_settings(rollout_cfg):  # GPU-engine knobs this engine does not read
                logger.warning(line)
        compute_dtype = resolve_compute_dtype(model_cfg.dtype, self.device)
        shared = lookup_policy(self.share_name, self.rank) if self.share_name is not None else None
        self._source = shared.engine if shared is not None else None
        self.backend = "inproc" if rollout_cfg.name in SERVER_ENGINES else resolve_backend(ce.backend, shared)
        bucket_bytes = ce.update_weights_bucket_megabytes * 2**20
        if rollout_cfg.name in SERVER_ENGINES or self.backend == "http":
            self._init_server(rollout_cfg, shared, bucket_bytes)
            return
        if self.backend == "shared":
            assert shared is not None  # resolve_backend gives "shared" only with a colocated actor
            module, tokenizer = shared.module, shared.tokenizer
        else:
            module, tokenizer = load_model_and_tokenizer(
                model_cfg.path,
                dtype=compute_dtype,
                trust_remote_code=model_cfg.trust_remote_code,
                attn_implementation=policy_attn_implementation(self.config, self.device),
            )
            module = module.requires_grad_(False).to(self.device)
        # The built-in sampler comes as its agent-loop form: the plain path unless
        # multi_turn.enable is on or a batch has an agent_name column.
        name = "agent_loop" if rollout_cfg.name == "torch" else rollout_cfg.name
        # every registered rollout takes these arguments; the abstract BaseRollout declares no constructor
        rollout_cls: Callable[..., BaseRollout] = ROLLOUTS.get(name)
        rollout = rollout_cls(rollout_cfg, module, tokenizer, dtype=compute_dtype)
        self._rollout = rollout
        kwargs = dict(ce.engine_kwargs)
        if self.backend == "disk" and kwargs.get("dir") is not None:
            kwargs["dir"] = f"{kwargs['dir']}/rank{self.rank}"  # one folder per rank: each loads its own copy
        target = ModuleTarget(module, on_swap=rollout.weights_changed)
        self._sync = build_weight_sync(self.backend, target, bucket_bytes, **kwargs)

    def _init_server(self, rollout_cfg: Any, shared: SharedPolicy | None, bucket_bytes: int) -> None:
        from hybridflow.workers.rollout.server_rollout import ServerRollout

        tokenizer = shared.tokenizer if shared is not None else self._load_tokenizer()
        if rollout_cfg.name in SERVER_ENGINES:
            from hybridflow.inference.adapters import make_adapter

            if shared is None and rollout_cfg.load_format == "dummy":
                # verl's rule: random weights only where a colocated actor replaces them before the
                # first generation; a rollout of its own loads the model's files.
                logger.warning("rollout.load_format=dummy needs a colocated actor; this rollout has none: using auto")
                rollout_cfg = replace(rollout_cfg, load_format="auto")
            path = str(resolve_model_path(self.config.model.path))
            server = make_adapter(rollout_cfg.name, path, **engine_args(rollout_cfg))
            self._engine = server
            self._server_target = _ServerTarget(server)
            self._sync = build_weight_sync("inproc", self._server_target, bucket_bytes)
        else:
            from hybridflow.inference.client import HttpClient

            kwargs = dict(rollout_cfg.checkpoint_engine.engine_kwargs)
            server = HttpClient(
                kwargs["url"],
                api_key=kwargs.get("api_key"),
                timeout_s=float(kwargs.get("timeout_s", 600.0)),
                weight_bucket_bytes=bucket_bytes,
            )
            self._sync = build_weight_sync("http", server, bucket_bytes)
        self._rollout = ServerRollout(rollout_cfg, server, tokenizer)

    def _load_tokenizer(self) -> Any:
        return load_tokenizer(self.config.model.path, trust_remote_code=self.config.model.trust_remote_code)

    @property
    def rollout(self) -> BaseRollout:
        if self._rollout is None:
            raise RuntimeError("RolloutWorker.init_model() has not been called")
        return self._rollout

    @property
    def shares_actor_module(self) -> bool:
        """True when sampling from the colocated actor's module (weights are always current)."""
        return self.backend == "shared"

    @register(dispatch_mode=DP_ROLLOUT)
    def generate_sequences(self, prompts: DataProto) -> RolloutOutput:
        """Responses for this rank's prompts (fields: see :mod:`hybridflow.workers.rollout.base`),
        stamped with ``meta_info["weight_version"]``, and the call's metrics. Through a worker
        group: the ranks' data concatenated, metrics as ``{name: [one value per rank]}``."""
        if self.pull_before_generating:
            self._pull_weights_if_stale(self.weight_version)
        out, metrics = self.rollout.generate_with_metrics(prompts.to(self.device))
        out.meta_info[F.META_WEIGHT_VERSION] = self.weight_version
        return RolloutOutput(out.to("cpu"), metrics)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def update_weights(self, weights: NamedTensors | None = None, version: int | None = None) -> dict[str, float]:
        """Bring the rollout to the actor's current weights and stamp ``version`` (default: one
        more than now). Returns the sync's ``weight_sync/*`` metrics (empty when nothing moved).

        ``weights``: explicit ``(name, tensor)`` pairs or a mapping with the policy's
        state-dict names (a rollout without a colocated actor); None pulls from the colocated
        actor engine (all ranks together: a sharded engine gathers collectively).
        """
        version = self.weight_version + 1 if version is None else int(version)
        if weights is not None:
            return self._sync_now(named_pairs(weights), version)
        if self._source is None:
            raise ValueError(
                "update_weights() without weights: this rollout has no colocated actor (share_name=None); "
                "pass the actor's (name, tensor) pairs"
            )
        if not self._pull_weights_if_stale(version):
            self.weight_version = version  # the weights did not change since the last sync
            self.last_sync = {}
        return self.last_sync

    def _pull_weights_if_stale(self, version: int) -> bool:
        """Sync from the colocated actor engine when its weights changed since the last sync
        (collective for a sharded engine: every rank runs this at the same point)."""
        engine = self._source
        if engine is None or engine.weights_version == self._synced_engine_version:
            return False
        if self.backend == "shared":
            self._sync_now((), version)
        elif self.backend == "http" and self.rank != 0:
            for _ in engine.iter_sync_weights():  # the gather is collective; rank 0 alone posts
                pass
            self.weight_version = version
        else:
            self._sync_now(engine.iter_sync_weights(), version)
        self._synced_engine_version = engine.weights_version
        return True

    def _sync_now(self, pairs: NamedTensorPairs, version: int) -> dict[str, float]:
        # A rollout that generates on a live engine (partial rollout) must not start one between
        # the swap and the version stamp: both happen under its swap lock.
        capabilities = self.rollout.capabilities
        sync = self._sync
        assert sync is not None  # init_model sets it with the rollout (self.rollout raised otherwise)
        if self._server_target is not None:  # the engine stamps its tokens with the version it loads
            self._server_target.weight_version = version
        with self.rollout.swap_lock if capabilities.swap_lock else contextlib.nullcontext():
            report = sync.sync(pairs, version)
            if capabilities.weight_version:
                self.rollout.set_weight_version(version)
        self.weight_version = version
        self.last_sync = {**report.metrics(), "timing_s/weight_sync_transfer": report.seconds}
        return self.last_sync

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def set_pull_before_generating(self, enabled: bool) -> None:
        """Whether :meth:`generate_sequences` first pulls weights that changed since the last
        sync (on by default). Asynchronous training turns it off: its rollout must keep the
        version it was synced to while the actor trains ahead."""
        self.pull_before_generating = bool(enabled)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def set_partial_rollout(self, enabled: bool) -> None:
        """Partial rollout (asynchronous training): generation runs through the agent loops on
        an engine that :meth:`abort_generation` can interrupt and :meth:`resume_generation`
        continue, the weights swapped in between. Needs a rollout whose capabilities declare
        ``partial_rollout`` (RolloutCapabilityError otherwise); turning it off always works."""
        self.rollout.set_partial_rollout(bool(enabled))

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def abort_generation(self) -> int:
        """Abort the generation in flight (partial rollout): its requests hand back their tokens
        and wait, resubmitted, for :meth:`resume_generation`. Returns how many were aborted."""
        return self.rollout.abort_generation()

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def resume_generation(self) -> None:
        """Let the requests :meth:`abort_generation` stopped continue (partial rollout)."""
        self.rollout.resume_generation()

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def sleep(self) -> None:
        """Free the engine's memory for the training phases (colocated, ``free_cache_engine``).

        vLLM / SGLang sleep at the adapter's ``sleep_level`` (verl's rule: 2, the weights and the
        KV cache discarded; the next sync re-sends every tensor, so it is forced even when the
        actor did not change); without a colocated actor to re-send them, level 1 (weights kept
        in host memory). The built-in sampler frees its KV cache and packed weight copies (they
        are rebuilt by the next generation); an ``http`` server, another process, is left alone.
        """
        if self._engine is not None:
            level = self._engine.sleep_level if self._source is not None else 1
            run_coroutine(self._engine.sleep(level))
            if level == 2:
                self._synced_engine_version = -1  # the weights are gone: the next sync must push them
        elif self.backend != "http" and self.rollout.capabilities.sleep_wake:
            self.rollout.release()

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def wake_up(self, tags: Sequence[str] | None = None) -> None:
        """Give back what :meth:`sleep` freed: ``tags`` of ``("weights", "kv_cache")`` (None: both).
        The trainer wakes the weights, pushes the new ones, then wakes the KV cache (verl's order:
        the cache is not allocated while the update's buckets are in flight). The built-in
        sampler has nothing to restore: its next generation rebuilds what it needs."""
        if self._engine is not None:
            run_coroutine(self._engine.wake_up(None if tags is None else list(tags)))

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def release(self) -> None:
        """Free the engine's memory between rollouts (KV cache, packed weights); needs a rollout
        whose capabilities declare ``sleep_wake``."""
        self.rollout.release()

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def resume(self) -> None:
        self.rollout.resume()

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def close(self) -> None:
        """Stop the rollout's engine thread; release the weight sync's connections and files."""
        if self._rollout is not None:
            self._rollout.close()
        if self._sync is not None:
            self._sync.close()
