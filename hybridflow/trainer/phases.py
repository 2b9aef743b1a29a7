"""The consumer side of the trainer: phases 3–7 on a generated, scored batch.

::

    3  old logp      actor.compute_log_prob         (skipped when on-policy, or in bypass mode)
    3b correction    rollout correction: IS weights / rejection (decoupled), or ℓ_old := ℓ_rollout (bypass)
    4  ref logp      ref.compute_ref_log_prob       (when a KL term needs it)
    4b teacher logp  teacher.compute_teacher_log_prob (on-policy distillation)
    5  values        critic.compute_values          (when the estimator needs values)
    6  advantage     KL-in-reward, then ADV_ESTIMATORS[name] via compute_advantage
                     (+ distillation: task advantage × reward_weight, teacher's per-token reward)
    7  update        critic.update_critic, actor.update_actor (after critic_warmup)

Which optional phases run is decided once, from the estimator's declared needs
(``EstimatorSpec``) and the config — never by branching on the estimator's name.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from hybridflow import fields as F
from hybridflow.algorithms.advantages import compute_advantage, get_estimator_spec
from hybridflow.algorithms.kl import apply_kl_penalty, get_kl_controller
from hybridflow.config import PPOConfig
from hybridflow.config.params import advantage_params
from hybridflow.protocol import DataProto
from hybridflow.reward import scored_extra_floats
from hybridflow.trainer.balance import balance_batch
from hybridflow.trainer.distillation import distill_advantages
from hybridflow.trainer.metrics import Timer, reduce_metrics
from hybridflow.trainer.pf_ppo import pf_ppo_resample
from hybridflow.trainer.rollout_correction import (
    apply_decoupled_correction,
    correction_mode,
    use_rollout_log_probs_as_old,
)


def needs_reference(config: PPOConfig) -> bool:
    """A reference policy is built iff a KL term or the estimator needs ℓ_ref."""
    algo = config.algorithm
    spec = get_estimator_spec(algo.adv_estimator)
    return config.actor_rollout_ref.actor.use_kl_loss or algo.use_kl_in_reward or spec.needs_ref_log_prob


@dataclass
class WorkerGroups:
    """The controller's handles: one worker group per role (``critic``/``ref`` optional)."""

    actor: Any
    rollout: Any
    ref: Any | None = None
    critic: Any | None = None
    rm: Any | None = None  # reward-model workers (reward_model.enable with a sequence-classification model)
    teacher: Any | None = None  # distillation teacher (distillation.enabled)
    owners: list[Any] = field(default_factory=list)  # groups that own worker processes; shut down at the end


class PolicyUpdate:
    """Phases 3–7, planned once from the config."""

    def __init__(self, config: PPOConfig, workers: WorkerGroups) -> None:
        self.config, self.workers = config, workers
        algo, arr = config.algorithm, config.actor_rollout_ref
        self.spec = get_estimator_spec(algo.adv_estimator)
        self.use_critic = bool(config.critic.enable)
        self.use_kl_in_reward = algo.use_kl_in_reward
        self.use_reference = needs_reference(config)
        self.kl_ctrl = get_kl_controller(
            algo.kl_ctrl.type, algo.kl_ctrl.kl_coef, algo.kl_ctrl.horizon, algo.kl_ctrl.target_kl
        )
        on_policy = arr.actor.ppo_mini_batch_size == config.data.train_batch_size and arr.actor.ppo_epochs == 1
        self.correction = correction_mode(algo.rollout_correction)
        self.distill = config.distillation if config.distillation.enabled else None
        # ℓ_old must be computed unless the actor can take it from its own first forward pass,
        # or bypass mode takes the rollout's instead; the teacher's per-token reward
        # (use_policy_gradient) is computed against ℓ_old.
        fold = self.distill is not None and self.distill.distillation_loss.use_policy_gradient
        self.compute_old_log_probs = self.correction == "decoupled" or (
            self.correction == "off"
            and (not on_policy or self.use_kl_in_reward or self.spec.needs_old_log_probs or fold)
        )
        # The old-log-prob pass's per-token entropy is a metric (verl drops it from the batch
        # too); it stays in the batch only for the rollout dump's per-token values.
        trainer = config.trainer
        self.keep_entropy = bool(trainer.rollout_data_dir) and trainer.rollout_token_rows > 0
        self.dp_size = trainer.nnodes * trainer.n_gpus_per_node
        self._check_workers(workers)

    def _check_workers(self, workers: WorkerGroups) -> None:
        if self.use_reference and workers.ref is None:
            raise ValueError(
                "this configuration needs a reference policy (KL loss / KL in reward) but no ref workers were built"
            )
        if self.distill is not None and workers.teacher is None:
            raise ValueError("distillation.enabled=true but no teacher workers were built")
        if self.use_critic and workers.critic is None:
            raise ValueError(
                f"adv_estimator={self.config.algorithm.adv_estimator} needs a critic but no critic workers were built"
            )

    def run(self, batch: DataProto, step: int, timer: Timer, metrics: dict[str, float]) -> DataProto:
        """Phases 3–7 at global step ``step``; returns the batch with what the phases added."""
        if self.config.trainer.balance_batch and self.dp_size > 1:
            metrics |= balance_batch(batch, self.dp_size)  # similar token counts per DP rank
        if self.compute_old_log_probs:
            with timer.phase("old_log_prob"):
                metrics |= self.compute_old_log_prob(batch)
        if self.correction == "bypass":
            use_rollout_log_probs_as_old(batch)
        elif self.correction == "decoupled":
            metrics |= apply_decoupled_correction(batch, self.config.algorithm.rollout_correction)
        batch = self.add_scores_of_other_models(batch, timer)
        with timer.phase("adv"):
            metrics |= self.compute_advantage(batch)
            if self.config.algorithm.use_pf_ppo:
                batch = pf_ppo_resample(batch, self.config.algorithm.pf_ppo, self.config.trainer.seed, step)
        if self.use_critic:
            with timer.phase("update_critic"):
                metrics |= self.update_critic(batch)
        if step > self.config.trainer.critic_warmup:
            with timer.phase("update_actor"):
                metrics |= self.update_actor(batch)
        return batch

    def add_scores_of_other_models(self, batch: DataProto, timer: Timer) -> DataProto:
        """4, 4b, 5: reference log-probs, the teacher's, the critic's values (those needed)."""
        workers = self.workers  # the groups each phase needs are there (_check_workers)
        if self.use_reference:
            assert workers.ref is not None
            with timer.phase("ref"):
                batch = batch.union(workers.ref.compute_ref_log_prob(batch))
        if self.distill is not None:
            assert workers.teacher is not None
            with timer.phase("teacher"):
                batch = batch.union(workers.teacher.compute_teacher_log_prob(batch))
        if self.use_critic:
            assert workers.critic is not None
            with timer.phase("values"):
                batch = batch.union(workers.critic.compute_values(batch))
        return batch

    def compute_old_log_prob(self, batch: DataProto) -> dict[str, float]:
        """3: ℓ_old and entropy from the actor; the rollout/actor mismatch is a metric. The
        entropy joins the batch only when the rollout dump writes per-token values."""
        out = self.workers.actor.compute_log_prob(batch, calculate_sum_pi_squared=self.spec.needs_sum_pi_squared)
        keep = [F.OLD_LOG_PROBS] + ([F.SUM_PI_SQUARED] if self.spec.needs_sum_pi_squared else [])
        keep += [F.ENTROPYS] if self.keep_entropy else []
        batch.union(out.select(batch_keys=keep))
        mask = batch.require_batch()[F.RESPONSE_MASK].bool()
        metrics = {"actor/entropy_old": out.require_batch()[F.ENTROPYS][mask].mean().item()}
        if F.ROLLOUT_LOG_PROBS in batch.require_batch().keys():
            diff = (batch.require_batch()[F.ROLLOUT_LOG_PROBS] - batch.require_batch()[F.OLD_LOG_PROBS]).abs()[mask]
            metrics["rollout/actor_logprob_diff"] = diff.max().item() if diff.numel() else 0.0
            metrics["rollout/actor_logprob_diff_mean"] = diff.mean().item() if diff.numel() else 0.0
        return metrics

    def compute_advantage(self, batch: DataProto) -> dict[str, float]:
        """6: KL-in-reward (if on), then the registered estimator through one call path."""
        td = batch.require_batch()
        metrics: dict[str, float] = {}
        mask = td[F.RESPONSE_MASK].float()
        if self.use_kl_in_reward:
            rewards, metrics = apply_kl_penalty(
                td[F.TOKEN_LEVEL_SCORES],
                td[F.OLD_LOG_PROBS],
                td[F.REF_LOG_PROB],
                mask,
                self.kl_ctrl,
                self.config.algorithm.kl_penalty,
            )
            td[F.TOKEN_LEVEL_REWARDS] = rewards
        else:
            td[F.TOKEN_LEVEL_REWARDS] = td[F.TOKEN_LEVEL_SCORES]
        keys = td.keys()

        def optional(key: str) -> torch.Tensor | None:
            return td[key] if key in keys else None

        advantages, returns = compute_advantage(
            self.config.algorithm.adv_estimator,
            token_level_rewards=td[F.TOKEN_LEVEL_REWARDS],
            response_mask=mask,
            index=batch.non_tensor_batch[F.UID],  # a numpy array, as verl passes it to estimators
            values=optional(F.VALUES),
            reward_baselines=optional(F.REWARD_BASELINES),
            old_log_probs=optional(F.OLD_LOG_PROBS),
            ref_log_prob=optional(F.REF_LOG_PROB),
            sum_pi_squared=optional(F.SUM_PI_SQUARED),
            reward_components=self.reward_components(batch),
            params=advantage_params(self.config.algorithm),
        )
        td[F.ADVANTAGES], td[F.RETURNS] = advantages, returns
        if self.distill is not None:
            metrics |= distill_advantages(batch, self.distill)
        return metrics

    def reward_components(self, batch: DataProto) -> torch.Tensor | None:
        """(B, K) scorer outputs named by ``algorithm.gdpo_reward_keys`` (multi-reward estimators)."""
        keys = self.config.algorithm.gdpo_reward_keys
        if not (self.spec.needs_multi_reward and keys):
            return None
        extra = batch.non_tensor_batch
        missing = [k for k in keys if k not in extra]
        if missing:
            raise ValueError(
                f"algorithm.gdpo_reward_keys names {missing}, which the scorer did not return "
                f"(the batch's columns: {sorted(extra)})"
            )
        columns = [scored_extra_floats(extra, k, "algorithm.gdpo_reward_keys") for k in keys]
        return torch.tensor(columns, dtype=torch.float32).T

    def update_critic(self, batch: DataProto) -> dict[str, float]:
        """7a: value-function update; returns critic/* metrics."""
        assert self.workers.critic is not None  # use_critic: checked in __init__ (_check_workers)
        return reduce_metrics(self.workers.critic.update_critic(batch))

    def update_actor(self, batch: DataProto) -> dict[str, float]:
        """7b: policy update; returns actor/* metrics."""
        return reduce_metrics(self.workers.actor.update_actor(batch))
