"""The derived defaults of a PPO config: every ``None`` documented as "= <other key>" filled in.

:func:`resolve_ppo_config` is phase 2 of :func:`~hybridflow.config.ppo_rules.finalize_ppo_config`
(after the per-key checks, before the cross-key rules), so consumers read plain values (e.g.
``clip_ratio_low`` is a float, ``critic.enable`` a bool).
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import TypeVar

from hybridflow.algorithms.advantages import get_estimator_spec
from hybridflow.config.actor_rollout_ref import (
    ActorConfig,
    ActorRolloutRefConfig,
    RolloutCorrectionConfig,
)
from hybridflow.config.distillation_rules import resolve_distillation
from hybridflow.config.ppo import (
    AlgorithmConfig,
    CriticConfig,
    DataConfig,
    PPOConfig,
    TrainerConfig,
)

T = TypeVar("T")

logger = logging.getLogger("hybridflow.config")


def _or(value: T | None, fallback: T) -> T:
    return fallback if value is None else value


def resolve_ppo_config(cfg: PPOConfig) -> PPOConfig:
    """Fill every "null = <other key>" default; the result has no such ``None`` left."""
    arr = cfg.actor_rollout_ref
    world_size = cfg.trainer.nnodes * cfg.trainer.n_gpus_per_node
    asynchronous = cfg.async_training.mode != "sync"
    algorithm = _resolve_algorithm(
        cfg.algorithm, arr.actor.policy_loss.loss_mode, bypass=asynchronous and cfg.async_training.use_rollout_log_probs
    )
    actor = _resolve_actor(arr.actor, world_size, algorithm.rollout_correction)
    rollout = replace(
        arr.rollout,
        prompt_length=_or(arr.rollout.prompt_length, cfg.data.max_prompt_length),
        response_length=_or(arr.rollout.response_length, cfg.data.max_response_length),
        seed=_or(arr.rollout.seed, cfg.trainer.seed),
        log_prob_use_dynamic_bsz=_or(arr.rollout.log_prob_use_dynamic_bsz, actor.use_dynamic_bsz),
        log_prob_max_token_len_per_gpu=_or(arr.rollout.log_prob_max_token_len_per_gpu, actor.ppo_max_token_len_per_gpu),
        # Asynchronous training needs the sampler's log-probs (the correction) and a rollout
        # with its own weights (it generates while the actor's change).
        calculate_log_probs=arr.rollout.calculate_log_probs or asynchronous,
        checkpoint_engine=_resolve_checkpoint_engine(arr.rollout.checkpoint_engine, asynchronous),
    )
    ref = replace(
        arr.ref,
        log_prob_use_dynamic_bsz=_or(arr.ref.log_prob_use_dynamic_bsz, actor.use_dynamic_bsz),
        log_prob_max_token_len_per_gpu=_or(arr.ref.log_prob_max_token_len_per_gpu, actor.ppo_max_token_len_per_gpu),
    )
    new_arr = ActorRolloutRefConfig(model=arr.model, actor=actor, rollout=rollout, ref=ref)
    needs_values = get_estimator_spec(cfg.algorithm.adv_estimator).needs_values
    return replace(
        cfg,
        distillation=resolve_distillation(cfg.distillation, ref),
        algorithm=algorithm,
        data=_resolve_data(cfg),
        actor_rollout_ref=new_arr,
        critic=_resolve_critic(cfg.critic, new_arr, needs_values),
        trainer=_resolve_trainer(cfg.trainer, main_job=cfg.data.train_files == DataConfig().train_files),
    )


def _resolve_data(cfg: PPOConfig) -> DataConfig:
    """``seed`` null = ``trainer.seed``; verl's fully-async switch ``gen_batch_size: 1`` is read as null."""
    data = replace(cfg.data, seed=_or(cfg.data.seed, cfg.trainer.seed))
    streaming = cfg.async_training.mode == "fully_async" and not cfg.algorithm.filter_groups.enable
    if streaming and data.gen_batch_size == 1 and data.train_batch_size != 1:
        # verl's rollouter asserts gen_batch_size == 1 (prompts streamed one at a time); ours
        # streams chunks of ppo_mini_batch_size prompts whatever the loader batch is.
        logger.warning(
            "ignored: data.gen_batch_size=1 (verl's fully-async streaming switch; the fully_async "
            "rollouter here streams chunks of actor.ppo_mini_batch_size prompts, so it is read as null)"
        )
        data = replace(data, gen_batch_size=None)
    return data


def _resolve_algorithm(algo: AlgorithmConfig, loss_mode: str, bypass: bool = False) -> AlgorithmConfig:
    """``rollout_rs_threshold`` null = ``rollout_is_threshold``; ``loss_mode=bypass_mode`` (the
    loss's name) switches bypass mode on, as ``bypass_mode=true`` does; so does ``bypass``
    (asynchronous training with ``use_rollout_log_probs``) unless a decoupled correction is set."""
    rc = algo.rollout_correction
    decoupled = rc.rollout_is is not None or rc.rollout_rs is not None
    rc = replace(
        rc,
        rollout_rs_threshold=_or(rc.rollout_rs_threshold, rc.rollout_is_threshold),
        bypass_mode=rc.bypass_mode or loss_mode == "bypass_mode" or (bypass and not decoupled),
    )
    return replace(algo, rollout_correction=rc)


def _resolve_checkpoint_engine(ce, asynchronous: bool):
    """``naive`` means a rollout copy (``inproc``) when training is asynchronous."""
    return replace(ce, backend="inproc") if asynchronous and ce.backend == "naive" else ce


def _resolve_actor(actor: ActorConfig, world_size: int, correction: RolloutCorrectionConfig) -> ActorConfig:
    """The actor reads the (resolved) rollout correction from its policy-loss section; bypass
    mode selects the bypass loss, as verl does."""
    strategy = actor.strategy
    if strategy == "auto":
        strategy = "torch" if world_size == 1 else "fsdp"
    loss_mode = "bypass_mode" if correction.bypass_mode else actor.policy_loss.loss_mode
    policy_loss = replace(actor.policy_loss, rollout_correction=correction, loss_mode=loss_mode)
    return replace(
        actor,
        strategy=strategy,
        clip_ratio_low=_or(actor.clip_ratio_low, actor.clip_ratio),
        clip_ratio_high=_or(actor.clip_ratio_high, actor.clip_ratio),
        policy_loss=policy_loss,
    )


def _resolve_critic(critic: CriticConfig, arr: ActorRolloutRefConfig, needs_values: bool) -> CriticConfig:
    actor = arr.actor
    micro = _or(critic.ppo_micro_batch_size_per_gpu, actor.ppo_micro_batch_size_per_gpu)
    model = replace(
        critic.model,
        path=_or(critic.model.path, arr.model.path),
        dtype=_or(critic.model.dtype, arr.model.dtype),
        attn_implementation=_or(critic.model.attn_implementation, arr.model.attn_implementation),
        use_remove_padding=_or(critic.model.use_remove_padding, arr.model.use_remove_padding),
    )
    return replace(
        critic,
        enable=_or(critic.enable, needs_values),
        strategy=_or(critic.strategy, actor.strategy),
        ppo_mini_batch_size=_or(critic.ppo_mini_batch_size, actor.ppo_mini_batch_size),
        ppo_micro_batch_size_per_gpu=micro,
        forward_micro_batch_size_per_gpu=_or(critic.forward_micro_batch_size_per_gpu, micro),
        use_dynamic_bsz=_or(critic.use_dynamic_bsz, actor.use_dynamic_bsz),
        forward_max_token_len_per_gpu=_or(critic.forward_max_token_len_per_gpu, critic.ppo_max_token_len_per_gpu),
        ppo_epochs=_or(critic.ppo_epochs, actor.ppo_epochs),
        shuffle=_or(critic.shuffle, actor.shuffle),
        loss_agg_mode=_or(critic.loss_agg_mode, actor.loss_agg_mode),
        model=model,
    )


# Rows of the main job's per-step dump that carry per-token values (a few KB a step).
MAIN_JOB_TOKEN_ROWS = 8


def _resolve_trainer(trainer: TrainerConfig, main_job: bool) -> TrainerConfig:
    """``default_local_dir`` null = ``checkpoints/{project}/{experiment}``. The main job (the
    built-in task's default ``data.train_files``) also records its rollouts and validation
    generations in that folder — tiny at its size — so ``hybridflow view`` shows them; with any
    other data the dumps stay off unless set, as in verl (a job's full dump can be large)."""
    run_dir = _or(trainer.default_local_dir, f"checkpoints/{trainer.project_name}/{trainer.experiment_name}")
    if not main_job:
        return replace(trainer, default_local_dir=run_dir)
    return replace(
        trainer,
        default_local_dir=run_dir,
        rollout_data_dir=_or(trainer.rollout_data_dir, f"{run_dir}/rollouts"),
        validation_data_dir=_or(trainer.validation_data_dir, f"{run_dir}/validation"),
        rollout_token_rows=trainer.rollout_token_rows
        or (MAIN_JOB_TOKEN_ROWS if trainer.rollout_data_dir is None else 0),
    )
