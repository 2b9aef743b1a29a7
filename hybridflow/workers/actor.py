"""The actor role: old log-probs and the PPO policy update (verl semantics).

``update_actor`` consumes a batch of rollouts with ``advantages`` (and ``old_log_probs``,
``ref_log_prob`` when the KL loss is on): rows are split into mini-batches of
``ppo_mini_batch_size × rollout.n ÷ dp_size`` rows, each mini-batch is one optimizer step
accumulated over micro-batches (by count or token budget), repeated ``ppo_epochs`` times.
On-policy shortcut: with a single mini-batch and ``ppo_epochs = 1`` the parameters have not
moved since the rollout, so ℓ_old is the detached current log-prob and ``compute_log_prob``
can be skipped (``needs_old_log_probs``).

Colocation: the live module is :attr:`ActorWorker.module`; ``init_model`` also publishes it
(see :mod:`hybridflow.workers.shared_policy`) so a colocated rollout samples from it and a
LoRA reference disables its adapters instead of loading a second model.
"""

from __future__ import annotations

import os
from functools import partial
from typing import Any

import torch
from tensordict import TensorDict
from transformers import PreTrainedTokenizerBase

from hybridflow import fields as FK
from hybridflow.config import ActorRolloutRefConfig
from hybridflow.config.distillation import DistillationConfig
from hybridflow.controller import Dispatch, Worker, register
from hybridflow.engine import TrainEngine
from hybridflow.engine.forward import response_log_probs
from hybridflow.engine.multimodal_inputs import engine_batch
from hybridflow.models import load_model_and_tokenizer, policy_attn_implementation, resolve_model_path
from hybridflow.models.hf_metadata import HF_CONFIG_DIR, save_hf_metadata
from hybridflow.models.processor import load_processor, save_tokenizer_or_processor
from hybridflow.protocol import DataProto
from hybridflow.workers.actor_loss import ADDITIVE_ACTOR_METRICS, ActorLoss
from hybridflow.workers.data_parallel import (
    DP_COMPUTE_PROTO_WITH_OPTIONS,
    DP_METRICS,
    dp_global_batch_info,
)
from hybridflow.workers.distillation_term import DistillationTerm
from hybridflow.workers.engine_factory import build_engine, needs_process_group
from hybridflow.workers.ppo_loop import (
    iter_mini_batches,
    load_shuffle_state,
    mean_over_steps,
    micro_batch_spec,
    reduce_micro_metrics,
    require_fields,
    response_mask_of,
    rows_per_mini_batch,
    save_shuffle_state,
)
from hybridflow.workers.shared_policy import (
    DEFAULT_SHARE_NAME,
    SharedPolicy,
    publish_policy,
)

_MODEL_INPUTS = (FK.INPUT_IDS, FK.ATTENTION_MASK, FK.RESPONSES)


def log_prob_temperature(sampling_temperature: float) -> float:
    """τ used to score tokens: the sampling temperature; greedy (τ = 0) scores with τ = 1."""
    return sampling_temperature if sampling_temperature > 0 else 1.0


class ActorWorker(Worker):
    """Trains the policy. Args: the ``actor_rollout_ref`` config; ``total_training_steps`` for
    the lr schedule; ``device``; ``seed`` (mini-batch shuffling); ``share_name`` — publish the
    live policy for colocated roles under this name (None: do not share); ``distillation``:
    the run's distillation section (its loss term and metrics join the actor's objective)."""

    def __init__(
        self,
        config: ActorRolloutRefConfig,
        total_training_steps: int | None = None,
        device: str = "cpu",
        seed: int = 0,
        share_name: str | None = DEFAULT_SHARE_NAME,
        distillation: DistillationConfig | None = None,
    ) -> None:
        super().__init__()
        self.config = config
        self.distillation = distillation
        self.total_training_steps = total_training_steps
        self.device = torch.device(device)
        self.share_name = share_name
        shuffle_seed = seed if config.actor.data_loader_seed is None else config.actor.data_loader_seed
        self._shuffle_generator = torch.Generator().manual_seed(shuffle_seed + self.rank)
        self._engine: TrainEngine | None = None
        self._tokenizer: PreTrainedTokenizerBase | None = None
        self._processor: Any = None  # a vision-language model's processor, saved with checkpoints

    # --- set-up -----------------------------------------------------------------------------
    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self) -> None:
        """Load the policy (fp32 parameters; bf16 runs under autocast) and build its engine."""
        model_cfg, actor = self.config.model, self.config.actor
        module, tokenizer = load_model_and_tokenizer(
            model_cfg.path,
            dtype="fp32",
            gradient_checkpointing=model_cfg.enable_gradient_checkpointing,
            lora_rank=model_cfg.lora_rank,
            lora_alpha=model_cfg.lora_alpha,
            target_modules=_target_modules(model_cfg.target_modules),
            trust_remote_code=model_cfg.trust_remote_code,
            attn_implementation=policy_attn_implementation(self.config, self.device),
        )
        if model_cfg.custom_chat_template is not None:
            tokenizer.chat_template = model_cfg.custom_chat_template
        self._tokenizer = tokenizer
        self._processor = load_processor(resolve_model_path(model_cfg.path))
        if needs_process_group(actor.strategy, self.world_size):
            self.init_process_group()
        self._engine = build_engine(
            module,
            actor.optim,
            strategy=actor.strategy,
            grad_clip=actor.grad_clip,
            micro_batch=micro_batch_spec(
                actor.use_dynamic_bsz,
                actor.ppo_micro_batch_size_per_gpu,
                actor.ppo_max_token_len_per_gpu,
                real_tokens=model_cfg.use_remove_padding,
            ),
            total_training_steps=self.total_training_steps,
            device=self.device,
            dtype=model_cfg.dtype,
            world_size=self.world_size,
            owner="actor_rollout_ref.actor",
        )
        if self.share_name is not None:
            shared = SharedPolicy(self.module, tokenizer, self._engine, model_cfg.lora_rank > 0, self.device)
            publish_policy(self.share_name, self.rank, shared)

    @property
    def engine(self) -> TrainEngine:
        if self._engine is None:
            raise RuntimeError("ActorWorker.init_model() has not been called")
        return self._engine

    @property
    def module(self) -> torch.nn.Module:
        """The live policy module (no copy): what a colocated rollout samples from."""
        return self.engine.module

    @property
    def tokenizer(self) -> PreTrainedTokenizerBase:
        if self._tokenizer is None:
            raise RuntimeError("ActorWorker.init_model() has not been called")
        return self._tokenizer

    def needs_old_log_probs(self, num_rows: int) -> bool:
        """False when ``update_actor`` on ``num_rows`` rows can use the on-policy shortcut."""
        actor = self.config.actor
        rows = rows_per_mini_batch(actor.ppo_mini_batch_size, self.config.rollout.n, self.world_size, "actor")
        return not (num_rows == rows and actor.ppo_epochs == 1)

    # --- log-probs --------------------------------------------------------------------------
    @register(dispatch_mode=DP_COMPUTE_PROTO_WITH_OPTIONS)
    def compute_log_prob(self, data: DataProto, calculate_sum_pi_squared: bool = False) -> DataProto:
        """``old_log_probs`` and ``entropys`` (B, T) of the responses at the sampling temperature
        (``meta_info["temperature"]``), and ``sum_pi_squared`` (Σ_v π_v²) with
        ``calculate_sum_pi_squared`` (an estimator that needs it)."""
        batch = _tensor_batch(data, "compute_log_prob")
        require_fields(batch, _MODEL_INPUTS, "compute_log_prob")
        rollout, actor = self.config.rollout, self.config.actor
        use_dynamic = (
            rollout.log_prob_use_dynamic_bsz if rollout.log_prob_use_dynamic_bsz is not None else actor.use_dynamic_bsz
        )
        max_tokens = rollout.log_prob_max_token_len_per_gpu or actor.ppo_max_token_len_per_gpu
        spec = micro_batch_spec(
            use_dynamic,
            rollout.log_prob_micro_batch_size_per_gpu,
            max_tokens,
            real_tokens=self.config.model.use_remove_padding,
        )
        temperature = log_prob_temperature(rollout.temperature)
        with_pi2 = bool(calculate_sum_pi_squared)
        forward = partial(
            response_log_probs,
            temperature=temperature,
            calculate_entropy=True,
            chunked_entropy=actor.entropy_from_logits_with_chunking,
            calculate_sum_pi_squared=with_pi2,
        )
        out = self.engine.infer(batch, forward, spec)
        tensors = {FK.OLD_LOG_PROBS: out["log_probs"], FK.ENTROPYS: out["entropy"]}
        if with_pi2:
            tensors[FK.SUM_PI_SQUARED] = out["sum_pi_squared"]
        return DataProto.from_dict(tensors=tensors, meta_info={FK.META_TEMPERATURE: temperature})

    # --- update -----------------------------------------------------------------------------
    @register(dispatch_mode=DP_METRICS)
    def update_actor(self, data: DataProto) -> dict[str, float]:
        """PPO update on ``data``; returns this rank's metrics (name → float, mean over steps).
        Through a worker group: ``{name: [one value per rank]}``."""
        actor, engine = self.config.actor, self.engine
        batch = _tensor_batch(data, "update_actor")
        rows = rows_per_mini_batch(actor.ppo_mini_batch_size, self.config.rollout.n, self.world_size, "actor")
        stored_old = self.needs_old_log_probs(int(batch.batch_size[0])) or FK.OLD_LOG_PROBS in batch.keys()
        needed = [*_MODEL_INPUTS, FK.ADVANTAGES]
        needed += [FK.OLD_LOG_PROBS] if stored_old else []
        needed += [FK.REF_LOG_PROB] if actor.use_kl_loss else []
        distill = DistillationTerm.from_config(self.distillation, actor.loss_agg_mode) if self.distillation else None
        needed += distill.required_fields() if distill is not None else []
        require_fields(batch, needed, "update_actor")
        forward = partial(
            response_log_probs,
            temperature=log_prob_temperature(self.config.rollout.temperature),
            calculate_entropy=True,  # always logged as actor/entropy; differentiated only if used
            entropy_requires_grad=actor.entropy_coeff != 0.0,
            chunked_entropy=actor.entropy_from_logits_with_chunking,
            gather_ids_key=FK.TEACHER_TOPK_IDS if distill is not None and distill.gathers_topk else None,
        )
        per_step: list[dict[str, float]] = []
        for mini in iter_mini_batches(batch, rows, actor.ppo_epochs, actor.shuffle, self._shuffle_generator):
            mask = response_mask_of(mini)
            info = dp_global_batch_info(mask, self.world_size, loss_scale_factor=float(mask.shape[1]))
            loss_fn = ActorLoss.from_config(actor, info, use_stored_old_log_probs=stored_old, distill=distill)
            step_metrics = reduce_micro_metrics(engine.forward_backward(mini, forward, loss_fn), ADDITIVE_ACTOR_METRICS)
            step = engine.optimizer_step()
            step_metrics.update(
                {"actor/grad_norm": step.grad_norm, "actor/lr": step.lr, "actor/skipped_step": float(step.skipped)}
            )
            per_step.append(step_metrics)
        engine.lr_scheduler_step()
        return mean_over_steps(per_step)

    # --- weights for a rollout in other processes ------------------------------------------
    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def export_sync_weights(self) -> dict[str, torch.Tensor] | None:
        """The policy's full weights (``iter_sync_weights``: LoRA merged, tied once) as CPU
        copies, on rank 0; None on the others. Every rank runs it: a sharded engine gathers
        collectively. For a rollout placed in its own processes (asynchronous training)."""
        pairs = ((name, tensor.detach().to("cpu", copy=True)) for name, tensor in self.engine.iter_sync_weights())
        if self.rank == 0:
            return dict(pairs)
        for _ in pairs:  # take part in the gather
            pass
        return None

    # --- checkpoints ------------------------------------------------------------------------
    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def save_checkpoint(self, path: str) -> None:
        """Engine state to ``path`` (every rank calls the engine with ``path``; a sharded engine
        writes per-rank files there), tokenizer too, and the HF config (+ LoRA adapter config)
        in ``path/hf_config`` for the model merger."""
        self.engine.save_checkpoint(path)
        save_shuffle_state(path, self.rank, self._shuffle_generator)
        if self.rank == 0:
            save_tokenizer_or_processor(self.tokenizer, self._processor, os.path.join(path, "tokenizer"))
            save_hf_metadata(self.module, os.path.join(path, HF_CONFIG_DIR))

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def load_checkpoint(self, path: str, load_optimizer: bool = True) -> None:
        self.engine.load_checkpoint(path, load_optimizer=load_optimizer)
        load_shuffle_state(path, self.rank, self._shuffle_generator)


def _tensor_batch(data: DataProto, what: str) -> TensorDict:
    if data.batch is None or len(data) == 0:
        raise ValueError(f"{what} needs a DataProto with a non-empty tensor batch")
    return engine_batch(data)  # the rows' images ride along when there are any


def _target_modules(value: str | tuple[str, ...]) -> str | list[str]:
    return value if isinstance(value, str) else list(value)
