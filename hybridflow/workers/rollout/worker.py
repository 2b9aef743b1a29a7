"""The rollout role: a worker that owns one rollout engine (``actor_rollout_ref.rollout.name``).

Colocated with the actor (the default placement) it samples from the actor's live module,
looked up under ``share_name`` (see :mod:`hybridflow.workers.shared_policy`): no second model,
no weight copy, nothing to push after an update. Placed on its own (``share_name=None``) it
loads the model from ``actor_rollout_ref.model.path`` and receives weights through
:meth:`RolloutWorker.update_weights`, bucket by bucket.

Colocated with a *sharded* actor (the FSDP engine: its module holds only this rank's rows of
each weight) it cannot sample from that module — every forward would be a collective, and
ranks stop generating at different steps. It keeps its own full copy instead and pulls the
actor engine's ``iter_sync_weights()`` (all ranks together) whenever the engine's
``weights_version`` moved: in ``update_weights()`` and, at the latest, before generating.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from hybridflow.config import ActorRolloutRefConfig
from hybridflow.engine.base import TrainEngine
from hybridflow.controller import Dispatch, Worker, register
from hybridflow.models import load_model_and_tokenizer, policy_attn_implementation
from hybridflow.protocol import DataProto
from hybridflow.utils.precision import resolve_compute_dtype
from hybridflow.workers.rollout.base import ROLLOUTS, BaseRollout, NamedTensors
from hybridflow.workers.rollout.weight_sync import iter_weight_buckets
from hybridflow.workers.shared_policy import DEFAULT_SHARE_NAME, lookup_policy


class RolloutWorker(Worker):
    """Generates responses. Args: the ``actor_rollout_ref`` config; ``device``; ``seed`` (used
    when ``rollout.seed`` is null); ``share_name`` — sample from the actor policy published
    under this name in this process (None: load an own copy of the model)."""

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
        self._rollout: BaseRollout | None = None
        self._shares_actor = False
        self._sync_source: TrainEngine | None = None  # a sharded actor engine to pull weights from
        self._synced_version = -1

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self) -> None:
        """Borrow the colocated actor's module, or load an own copy; build the rollout engine."""
        model_cfg, rollout_cfg = self.config.model, self.config.rollout
        compute_dtype = resolve_compute_dtype(model_cfg.dtype, self.device)
        shared = lookup_policy(self.share_name, self.rank) if self.share_name is not None else None
        if shared is not None and not shared.engine.shards_parameters:
            module, tokenizer = shared.module, shared.tokenizer
            self._shares_actor = True
        else:
            module, tokenizer = load_model_and_tokenizer(
                model_cfg.path,
                dtype=compute_dtype,
                trust_remote_code=model_cfg.trust_remote_code,
                attn_implementation=policy_attn_implementation(self.config, self.device),
            )
            module.requires_grad_(False)
            module = module.to(self.device)
            self._sync_source = shared.engine if shared is not None else None
        if rollout_cfg.seed is None:
            rollout_cfg = replace(rollout_cfg, seed=self.seed)
        # The built-in sampler comes as its agent-loop form: the plain path unless
        # multi_turn.enable is on or a batch has an agent_name column.
        name = "agent_loop" if rollout_cfg.name == "torch" else rollout_cfg.name
        rollout_cls = ROLLOUTS.get(name)
        self._rollout = rollout_cls(rollout_cfg, module, tokenizer, dtype=compute_dtype)

    @property
    def rollout(self) -> BaseRollout:
        if self._rollout is None:
            raise RuntimeError("RolloutWorker.init_model() has not been called")
        return self._rollout

    @property
    def shares_actor_module(self) -> bool:
        """True when sampling from the colocated actor's module (weights are always current)."""
        return self._shares_actor

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def generate_sequences(self, prompts: DataProto) -> DataProto:
        """Responses for this rank's prompts (fields: see :mod:`hybridflow.workers.rollout.base`)."""
        self._pull_weights_if_stale()
        out = self.rollout.generate_sequences(prompts.to(self.device))
        if self.config.rollout.free_cache_engine:
            # The packed weights go stale at the next update anyway; holding them (a full copy
            # of the model) through the training phases would only raise peak memory.
            self.rollout.release()
        return out.to("cpu")

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def update_weights(self, weights: NamedTensors | None = None) -> None:
        """Load the actor's new weights; nothing to do when sharing its module.

        ``weights``: ``(name, tensor)`` pairs or a mapping with the policy's state-dict names
        (e.g. the engine's ``iter_sync_weights()``); they are loaded in buckets of
        ``rollout.update_weights_bucket_megabytes``.
        """
        if weights is None:
            if self._sync_source is not None:
                self._pull_weights_if_stale()
                return
            if self._shares_actor:
                return
            raise ValueError(
                "update_weights() without weights: this rollout holds its own model copy "
                "(share_name=None); pass the actor's (name, tensor) pairs"
            )
        self._load_in_buckets(weights.items() if isinstance(weights, dict) else weights)

    def _load_in_buckets(self, pairs: NamedTensors) -> None:
        budget = self.config.rollout.update_weights_bucket_megabytes * 2**20
        for bucket in iter_weight_buckets(pairs, budget):
            self.rollout.update_weights(bucket)

    def _pull_weights_if_stale(self) -> None:
        """Copy the sharded actor's full weights when they changed since the last pull
        (collective: every rank runs this at the same point, with the same versions)."""
        engine = self._sync_source
        if engine is None or engine.weights_version == self._synced_version:
            return
        self._load_in_buckets(engine.iter_sync_weights())
        self._synced_version = engine.weights_version

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def release(self) -> None:
        """Free the engine's memory between rollouts (KV cache, packed weights)."""
        self.rollout.release()

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def resume(self) -> None:
        self.rollout.resume()
