"""The PPO-family trainer: ``fit()`` is a short loop around ``step()``, and ``step()`` is the
numbered phases of the HybridFlow paper's algorithm, each a named call.

::

    step(batch):
      0 prepare       uid per prompt, repeat rollout.n times (interleaved)
      1 rollout       rollout.generate_sequences           (+ ReMax greedy baseline pass)
      2 reward        rm.compute_rm_score (with a reward model), reward_fn(batch) → token_level_scores
     2b filter        DAPO dynamic sampling: drop groups whose responses all score alike,
                      repeat 0–2 on further prompt batches until the batch is full (optional)
      3 old logp      actor.compute_log_prob               (skipped when on-policy, or in bypass mode)
     3b correction    rollout correction: IS weights / rejection (decoupled), or ℓ_old := ℓ_rollout (bypass)
      4 ref logp      ref.compute_ref_log_prob             (when a KL term needs it)
     4b teacher logp  teacher.compute_teacher_log_prob     (on-policy distillation)
      5 values        critic.compute_values                (when the estimator needs values)
      6 advantage     KL-in-reward, then ADV_ESTIMATORS[name] via compute_advantage
                      (+ distillation: task advantage × reward_weight, teacher's per-token reward)
      7 update        critic.update_critic, actor.update_actor (after critic_warmup)
      8 weight sync   rollout.update_weights(version=step) through rollout.checkpoint_engine (a
                      version stamp only when the rollout shares the actor's module)

Which optional phases run is decided once, in ``__init__``, from the estimator's declared
needs (``EstimatorSpec``) and the config — never by branching on the estimator's name.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from collections.abc import Iterator
from typing import Any, Callable

import numpy as np
import torch
from tqdm import tqdm

from hybridflow import fields as F
from hybridflow.algorithms.advantages import compute_advantage, get_estimator_spec
from hybridflow.algorithms.kl import apply_kl_penalty, get_kl_controller
from hybridflow.config import PPOConfig
from hybridflow.config.params import advantage_params
from hybridflow.protocol import DataProto
from hybridflow.tracking import Tracking
from hybridflow.trainer import checkpoint as ckpt
from hybridflow.trainer.balance import balance_batch
from hybridflow.trainer.distillation import distill_advantages
from hybridflow.trainer.pf_ppo import pf_ppo_resample
from hybridflow.trainer.rollout_correction import (
    apply_decoupled_correction,
    correction_mode,
    use_rollout_log_probs_as_old,
)
from hybridflow.trainer.generations import dump_rollouts, print_samples, validation_rows, write_jsonl
from hybridflow.trainer.dynamic_sampling import SUMMED_REWARD_METRIC, response_metric, varied_group_rows
from hybridflow.trainer.metrics import (
    Timer,
    compute_data_metrics,
    compute_throughput_metrics,
    reduce_metrics,
    validation_extra_metrics,
    validation_metrics,
)
from hybridflow.workers.reward import reward_fault_metrics, scored_extra_floats

ROLLOUT_METRICS = "rollout_metrics"  # meta_info key: the rollout's metrics until the step collects them

RewardFn = Callable[[DataProto], tuple[torch.Tensor, dict[str, list[Any]]]]


def _object_column(values: list[Any]) -> np.ndarray:
    column = np.empty(len(values), dtype=object)  # element-wise, even for list-valued entries
    column[:] = values
    return column


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


class PPOTrainer:
    """Runs the algorithm on the controller and drives the worker groups."""

    def __init__(
        self,
        config: PPOConfig,
        tokenizer: Any,
        workers: WorkerGroups,
        reward_fn: RewardFn,
        val_reward_fn: RewardFn,
        train_loader: Any,
        val_loader: Any | None,
        tracking: Tracking,
        run_dir: str | Path,
        total_training_steps: int,
    ) -> None:
        self.config = config
        self.tokenizer = tokenizer
        self.workers = workers
        self.reward_fn = reward_fn
        self.val_reward_fn = val_reward_fn
        self.train_loader = train_loader
        self.val_loader = val_loader
        self.tracking = tracking
        self.run_dir = Path(run_dir)
        self.total_training_steps = total_training_steps
        self.global_steps = 0
        self.services: list[Any] = []  # child processes of this run (a served judge), closed with it
        self.resumed_state: dict[str, Any] = {}  # the controller state of the checkpoint resumed from

        algo, arr = config.algorithm, config.actor_rollout_ref
        self.spec = get_estimator_spec(algo.adv_estimator)
        self.use_critic = bool(config.critic.enable)
        self.use_kl_in_reward = algo.use_kl_in_reward
        self.use_reference = self.needs_reference(config)
        self.kl_ctrl = get_kl_controller(
            algo.kl_ctrl.type, algo.kl_ctrl.kl_coef, algo.kl_ctrl.horizon, algo.kl_ctrl.target_kl
        )
        rows = config.data.train_batch_size * arr.rollout.n
        on_policy = arr.actor.ppo_mini_batch_size == config.data.train_batch_size and arr.actor.ppo_epochs == 1
        # ℓ_old must be computed unless the actor can take it from its own first forward pass,
        # or bypass mode takes the rollout's instead.
        self.correction = correction_mode(algo.rollout_correction)
        self.distill = config.distillation if config.distillation.enabled else None
        # The teacher's per-token reward (use_policy_gradient) is computed against ℓ_old.
        fold = self.distill is not None and self.distill.distillation_loss.use_policy_gradient
        self.compute_old_log_probs = self.correction == "decoupled" or (self.correction == "off" and (
            not on_policy or self.use_kl_in_reward or self.spec.needs_old_log_probs or fold))
        self.rows_per_step = rows
        # Phase variants chosen once (ReMax's greedy baseline pass is one).
        self.baseline_phase = self.compute_reward_baselines if self.spec.needs_reward_baselines else None
        self.dp_size = config.trainer.nnodes * config.trainer.n_gpus_per_node
        if algo.filter_groups.enable and algo.filter_groups.metric == SUMMED_REWARD_METRIC and self.use_kl_in_reward:
            raise ValueError(
                "algorithm.filter_groups.metric=seq_final_reward needs the in-reward KL, which is computed after "
                "the groups are filtered; with algorithm.use_kl_in_reward=true filter on score or a scorer key (acc)"
            )
        if self.use_reference and workers.ref is None:
            raise ValueError("this configuration needs a reference policy (KL loss / KL in reward) but no ref workers were built")
        if self.distill is not None and workers.teacher is None:
            raise ValueError("distillation.enabled=true but no teacher workers were built")
        if self.use_critic and workers.critic is None:
            raise ValueError(f"adv_estimator={algo.adv_estimator} needs a critic but no critic workers were built")

    @staticmethod
    def needs_reference(config: PPOConfig) -> bool:
        """A reference policy is built iff a KL term or the estimator needs ℓ_ref."""
        algo = config.algorithm
        spec = get_estimator_spec(algo.adv_estimator)
        return config.actor_rollout_ref.actor.use_kl_loss or algo.use_kl_in_reward or spec.needs_ref_log_prob

    # ------------------------------------------------------------------------------ loop
    def fit(self) -> dict[str, float]:
        """Train until ``total_training_steps``; returns the last step's metrics."""
        early = self.begin_fit()
        if early is not None:
            return early
        trainer_cfg = self.config.trainer
        last: dict[str, float] = {}
        progress = tqdm(total=self.total_training_steps, initial=self.global_steps, desc="training", unit="step")
        batches = self._train_batches()
        while self.global_steps < self.total_training_steps:
            batch = DataProto.from_single_dict(next(batches))
            self.global_steps += 1
            # Only DAPO dynamic sampling draws further batches inside a step.
            dynamic = self.config.algorithm.filter_groups.enable
            last = self.step(batch, more_batches=batches) if dynamic else self.step(batch)
            is_last = self.global_steps == self.total_training_steps
            if (is_last or self._due(trainer_cfg.test_freq, is_last)) and self.val_loader is not None:
                last |= self.validate()
            self.tracking.log(last, step=self.global_steps)  # before the commit; rows past it: Tracking.rewind
            if self._due(trainer_cfg.save_freq, is_last):
                self.save_checkpoint()
            progress.set_postfix(score=f"{last['critic/score/mean']:.3f}", step_s=f"{last['timing_s/step']:.1f}")
            progress.update(1)
        progress.close()
        return last

    def begin_fit(self) -> dict[str, float] | None:
        """Resume, then: validate only (``val_only``), stop (already finished), or validate
        before the first step. Returns the run's result when there is nothing to train."""
        self.load_checkpoint()
        trainer_cfg = self.config.trainer
        if trainer_cfg.val_only:  # verl's evaluation-only run: validate the (resumed) policy, train nothing
            metrics = self.validate()
            self.tracking.log(metrics, step=self.global_steps)
            return metrics
        if self.global_steps >= self.total_training_steps:
            print(f"training already finished: step {self.global_steps} of {self.total_training_steps}; nothing to do")
            return {}
        if trainer_cfg.val_before_train and self.global_steps == 0 and self.val_loader is not None:
            self.tracking.log(self.validate(), step=0)
        return None

    def _train_batches(self):
        """Batches across epochs, continuing from the loader's (possibly restored) position."""
        while True:
            yield from self.train_loader

    def _due(self, freq: int, is_last: bool) -> bool:
        return freq > 0 and (self.global_steps % freq == 0 or is_last)

    def step(self, batch: DataProto, more_batches: Iterator[dict[str, Any]] | None = None) -> dict[str, float]:
        """One iteration of the algorithm; returns its metrics. ``more_batches``: where DAPO
        dynamic sampling takes further prompt batches from (the training loader)."""
        timer = Timer()
        metrics: dict[str, float] = {}
        with timer.phase("step"):
            batch = self.generate_and_score(batch, timer, metrics)
            if self.config.algorithm.filter_groups.enable:
                batch = self.keep_varied_groups(batch, more_batches, timer, metrics)
            batch = self.update_policy(batch, timer, metrics)
            with timer.phase("sync_weights"):
                metrics |= self.sync_rollout_weights()
        return self.step_metrics(batch, timer, metrics)

    def sync_rollout_weights(self) -> dict[str, float]:
        """8: the rollout takes the actor's weights, stamped with the step (``weight_sync/*``)."""
        return self.workers.rollout.update_weights(version=self.global_steps)[0]

    def update_policy(self, batch: DataProto, timer: Timer, metrics: dict[str, float]) -> DataProto:
        """Phases 3–7 on a generated, scored batch: old log-probs (or the rollout's, in bypass
        mode), reference, values, advantages, critic and actor updates. Returns the batch with
        what the phases added."""
        if self.config.trainer.balance_batch and self.dp_size > 1:
            metrics |= balance_batch(batch, self.dp_size)  # similar token counts per DP rank
        if self.compute_old_log_probs:
            with timer.phase("old_log_prob"):
                metrics |= self.compute_old_log_prob(batch)
        if self.correction == "bypass":
            use_rollout_log_probs_as_old(batch)
        elif self.correction == "decoupled":
            metrics |= apply_decoupled_correction(batch, self.config.algorithm.rollout_correction)
        if self.use_reference:
            with timer.phase("ref"):
                batch = batch.union(self.workers.ref.compute_ref_log_prob(batch))
        if self.distill is not None:
            with timer.phase("teacher"):
                batch = batch.union(self.workers.teacher.compute_teacher_log_prob(batch))
        if self.use_critic:
            with timer.phase("values"):
                batch = batch.union(self.workers.critic.compute_values(batch))
        with timer.phase("adv"):
            metrics |= self.compute_advantage(batch)
            if self.config.algorithm.use_pf_ppo:
                batch = pf_ppo_resample(batch, self.config.algorithm.pf_ppo, self.config.trainer.seed, self.global_steps)
        if self.use_critic:
            with timer.phase("update_critic"):
                metrics |= self.update_critic(batch)
        if self.global_steps > self.config.trainer.critic_warmup:
            with timer.phase("update_actor"):
                metrics |= self.update_actor(batch)
        return batch

    def step_metrics(self, batch: DataProto, timer: Timer, metrics: dict[str, float]) -> dict[str, float]:
        """The step's metrics: data, timing, throughput (and the rollout dump when asked)."""
        if self.config.trainer.rollout_data_dir:
            dump_rollouts(self.config.trainer.rollout_data_dir, self.global_steps, self.tokenizer, batch)
        metrics |= compute_data_metrics(batch, self.use_critic)
        metrics |= timer.metrics()
        metrics |= compute_throughput_metrics(batch, timer.timings["step"])
        metrics["training/global_step"] = float(self.global_steps)
        return metrics

    # ------------------------------------------------------------------------------ phases
    def generate_and_score(
        self, batch: DataProto, timer: Timer, metrics: dict[str, float], gen_batch: int = 0, step: int | None = None
    ) -> DataProto:
        """Phases 0–2 on one prompt batch (``gen_batch``: its number within the step; ``step``:
        the step whose uids and sampling seed it gets, default the current one — an asynchronous
        rollouter generates for steps ahead of the trainer)."""
        batch = self.prepare(batch, self.config.actor_rollout_ref.rollout.n, gen_batch, step)
        with timer.phase("gen"):
            batch = self.generate(batch, gen_batch=gen_batch, step=step)
        for name, value in batch.meta_info.pop(ROLLOUT_METRICS, {}).items():  # agent loops: num_turns/*, ...
            metrics[name] = value
        if self.baseline_phase is not None:
            with timer.phase("gen_baseline"):
                batch = self.baseline_phase(batch)
        with timer.phase("reward"):
            for name, value in self.compute_reward(batch).items():  # counts add up over generation batches
                metrics[name] = metrics.get(name, 0.0) + value
        return batch

    def prepare(self, batch: DataProto, n: int, gen_batch: int = 0, step: int | None = None) -> DataProto:
        """0: a group id per prompt (deterministic: step, generation batch and row), then n
        interleaved copies."""
        step = self.global_steps if step is None else step
        prefix = f"{step}" if gen_batch == 0 else f"{step}.{gen_batch}"
        uids = np.array([f"{prefix}-{i}" for i in range(len(batch))], dtype=object)
        batch.non_tensor_batch[F.UID] = uids
        return batch.repeat(repeat_times=n, interleave=True)

    def generate(
        self, batch: DataProto, validate: bool = False, gen_batch: int = 0, progress_desc: str | None = None,
        step: int | None = None,
    ) -> DataProto:
        """1: sample one response per row; the step number (and generation batch) seeds the
        sampler (resumable). ``progress_desc``: the rollout shows a progress bar with this title."""
        prompts = batch.pop(batch_keys=[F.INPUT_IDS, F.ATTENTION_MASK, F.POSITION_IDS])
        # The rows' columns travel too (an agent loop reads raw_prompt, agent_name, tools_kwargs, ...);
        # the rollout returns them unchanged, so the union below finds them equal.
        prompts.non_tensor_batch.update(batch.non_tensor_batch)
        prompts.meta_info.update(self._sampling_meta(validate, gen_batch, step))
        if progress_desc:
            prompts.meta_info["progress_desc"] = progress_desc
        output = self.workers.rollout.generate_sequences(prompts)
        if not self.config.actor_rollout_ref.rollout.calculate_log_probs and F.ROLLOUT_LOG_PROBS in output.batch.keys():
            output.pop(batch_keys=[F.ROLLOUT_LOG_PROBS])  # kept only when asked for (verl's calculate_log_probs)
        # Rollout metrics (agent loops: num_turns/*, tool_call_counts/*, agent_loop/*), one list per
        # key when several ranks generated; the response_mask stays the rollout's (0 on tool tokens).
        rollout_metrics = reduce_metrics(output.meta_info.pop("metrics", None) or {})
        batch = output.union(batch)
        if rollout_metrics:
            batch.meta_info[ROLLOUT_METRICS] = rollout_metrics
        return batch

    def keep_varied_groups(
        self, batch: DataProto, more_batches: Iterator[dict[str, Any]] | None, timer: Timer, metrics: dict[str, float]
    ) -> DataProto:
        """2b (DAPO dynamic sampling): keep the groups whose responses differ in
        ``filter_groups.metric``; generate and score further prompt batches until
        ``train_batch_size`` such groups are kept, then use the first of them."""
        cfg, want = self.config.algorithm.filter_groups, self.config.data.train_batch_size
        n = self.config.actor_rollout_ref.rollout.n
        parts, groups, gen_batches = [], 0, 1
        while True:
            rows, kept = varied_group_rows(response_metric(batch, cfg.metric), batch.non_tensor_batch[F.UID])
            parts.append(batch.select_idxs(rows))
            groups += kept
            if groups >= want:
                break
            if 0 < cfg.max_num_gen_batches <= gen_batches:
                raise RuntimeError(
                    f"DAPO dynamic sampling: {gen_batches} generation batches left only {groups} of "
                    f"{want} prompt groups whose responses differ in {cfg.metric!r}; the task may be too easy "
                    "or too hard for the model. Raise algorithm.filter_groups.max_num_gen_batches (≤ 0: no limit) "
                    "or check the data and the reward."
                )
            if more_batches is None:
                raise ValueError("DAPO dynamic sampling needs further prompt batches: call step(batch, more_batches=...)")
            batch = self.generate_and_score(DataProto.from_single_dict(next(more_batches)), timer, metrics, gen_batches)
            gen_batches += 1
        metrics["train/num_gen_batches"] = float(gen_batches)
        metrics["train/kept_groups"] = float(groups)
        # The parts' sampling meta differs only in the seed; the batch keeps its first part's.
        parts = [DataProto(batch=p.batch, non_tensor_batch=p.non_tensor_batch, meta_info=parts[0].meta_info) for p in parts]
        return DataProto.concat(parts).select_idxs(np.arange(want * n))

    def _sampling_meta(self, validate: bool, gen_batch: int = 0, step: int | None = None) -> dict[str, Any]:
        rollout = self.config.actor_rollout_ref.rollout
        step = self.global_steps if step is None else step
        seed = self.config.trainer.seed * 1_000_003 + step * 2 + int(validate)
        if gen_batch:  # further DAPO generation batches of this step (or chunks of an async step): own seeds
            seed = int(np.random.SeedSequence([self.config.trainer.seed, step, gen_batch]).generate_state(1)[0])
        meta: dict[str, Any] = {
            "eos_token_id": self.tokenizer.eos_token_id,
            "pad_token_id": self.tokenizer.pad_token_id,
            "seed": seed,
            "validate": validate,
        }
        if self.config.data.apply_chat_template_kwargs:  # an agent loop renders turns as the dataset did
            meta["chat_template_kwargs"] = dict(self.config.data.apply_chat_template_kwargs)
        if validate:
            vk = rollout.val_kwargs
            meta |= {"do_sample": vk.do_sample, "temperature": vk.temperature, "top_p": vk.top_p, "top_k": vk.top_k}
        return meta

    def compute_reward_baselines(self, batch: DataProto) -> DataProto:
        """1b (ReMax): score one greedy response per prompt; it is each row's baseline b_i."""
        n = self.config.actor_rollout_ref.rollout.n
        firsts = batch.select_idxs(np.arange(0, len(batch), n))
        prompts = firsts.select(batch_keys=[F.PROMPTS], non_tensor_batch_keys=list(firsts.non_tensor_batch))
        greedy_in = DataProto.from_dict(
            tensors={
                F.INPUT_IDS: firsts.batch[F.PROMPTS],
                F.ATTENTION_MASK: firsts.batch[F.ATTENTION_MASK][:, : firsts.batch[F.PROMPTS].shape[1]],
                F.POSITION_IDS: firsts.batch[F.POSITION_IDS][:, : firsts.batch[F.PROMPTS].shape[1]],
            },
            non_tensors=dict(prompts.non_tensor_batch),  # an agent loop reads raw_prompt, agent_name, ...
            meta_info={**self._sampling_meta(False), "do_sample": False},
        )
        greedy = self.workers.rollout.generate_sequences(greedy_in)
        greedy.non_tensor_batch.update(prompts.non_tensor_batch)
        scores, _ = self.reward_fn(self.add_rm_scores(greedy))
        baselines = scores.sum(-1).repeat_interleave(n)
        batch.batch[F.REWARD_BASELINES] = baselines
        return batch

    def add_rm_scores(self, batch: DataProto) -> DataProto:
        """2a: ``rm_scores`` from the reward-model workers, if any (the manager reads them)."""
        if self.workers.rm is None:
            return batch
        return batch.union(self.workers.rm.compute_rm_score(batch))

    def compute_reward(self, batch: DataProto) -> dict[str, float]:
        """2: token_level_scores (B, T) from the reward manager; fault counts as metrics."""
        scores, extra = self.reward_fn(self.add_rm_scores(batch))
        batch.batch[F.TOKEN_LEVEL_SCORES] = scores
        # Per-response values travel as columns (as in verl), so row reordering (balance_batch)
        # and row selection (dynamic sampling) keep them aligned.
        clash = sorted(set(extra) & set(batch.non_tensor_batch))
        if clash:
            raise ValueError(f"the reward function returned keys {clash} that are already batch columns")
        for key, values in extra.items():
            batch.non_tensor_batch[key] = _object_column(values)
        return reward_fault_metrics(extra)

    def compute_old_log_prob(self, batch: DataProto) -> dict[str, float]:
        """3: ℓ_old and entropy from the actor; the rollout/actor mismatch is a metric."""
        batch.meta_info["calculate_sum_pi_squared"] = self.spec.needs_sum_pi_squared
        out = self.workers.actor.compute_log_prob(batch)
        keep = [F.OLD_LOG_PROBS] + ([F.SUM_PI_SQUARED] if self.spec.needs_sum_pi_squared else [])
        batch.union(out.select(batch_keys=keep))
        mask = batch.batch[F.RESPONSE_MASK].bool()
        metrics = {"actor/entropy_old": out.batch[F.ENTROPYS][mask].mean().item()}
        if F.ROLLOUT_LOG_PROBS in batch.batch.keys():
            diff = (batch.batch[F.ROLLOUT_LOG_PROBS] - batch.batch[F.OLD_LOG_PROBS]).abs()[mask]
            metrics["rollout/actor_logprob_diff"] = diff.max().item() if diff.numel() else 0.0
            metrics["rollout/actor_logprob_diff_mean"] = diff.mean().item() if diff.numel() else 0.0
        return metrics

    def compute_advantage(self, batch: DataProto) -> dict[str, float]:
        """6: KL-in-reward (if on), then the registered estimator through one call path."""
        td, metrics = batch.batch, {}
        mask = td[F.RESPONSE_MASK].float()
        if self.use_kl_in_reward:
            rewards, metrics = apply_kl_penalty(
                td[F.TOKEN_LEVEL_SCORES], td[F.OLD_LOG_PROBS], td[F.REF_LOG_PROB], mask,
                self.kl_ctrl, self.config.algorithm.kl_penalty,
            )
            td[F.TOKEN_LEVEL_REWARDS] = rewards
        else:
            td[F.TOKEN_LEVEL_REWARDS] = td[F.TOKEN_LEVEL_SCORES]
        keys = td.keys()
        advantages, returns = compute_advantage(
            self.config.algorithm.adv_estimator,
            token_level_rewards=td[F.TOKEN_LEVEL_REWARDS],
            response_mask=mask,
            index=batch.non_tensor_batch[F.UID],
            values=td[F.VALUES] if F.VALUES in keys else None,
            reward_baselines=td[F.REWARD_BASELINES] if F.REWARD_BASELINES in keys else None,
            old_log_probs=td[F.OLD_LOG_PROBS] if F.OLD_LOG_PROBS in keys else None,
            ref_log_prob=td[F.REF_LOG_PROB] if F.REF_LOG_PROB in keys else None,
            sum_pi_squared=td[F.SUM_PI_SQUARED] if F.SUM_PI_SQUARED in keys else None,
            reward_components=self._reward_components(batch),
            params=advantage_params(self.config.algorithm),
        )
        td[F.ADVANTAGES], td[F.RETURNS] = advantages, returns
        if self.distill is not None:
            metrics |= distill_advantages(batch, self.distill)
        return metrics

    def _reward_components(self, batch: DataProto) -> torch.Tensor | None:
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
        return reduce_metrics(self.workers.critic.update_critic(batch).meta_info["metrics"])

    def update_actor(self, batch: DataProto) -> dict[str, float]:
        """7b: policy update; returns actor/* metrics."""
        return reduce_metrics(self.workers.actor.update_actor(batch).meta_info["metrics"])

    # ------------------------------------------------------------------------------ validation
    def validate(self) -> dict[str, float]:
        """Greedy (val_kwargs) responses on the whole validation set, scored per data source;
        written to ``trainer.validation_data_dir`` and printed (``log_val_generations``) if set."""
        vk, trainer_cfg = self.config.actor_rollout_ref.rollout.val_kwargs, self.config.trainer
        sources, prompt_ids, scores, preds, rows = [], [], [], [], []
        extras: dict[str, list[object]] = {}
        keep_rows = bool(trainer_cfg.validation_data_dir) or trainer_cfg.log_val_generations > 0
        started, batches = time.perf_counter(), len(self.val_loader)
        val_rollout: dict[str, list[float]] = {}
        for start, batch_dict in enumerate(self.val_loader):
            batch = DataProto.from_single_dict(batch_dict)
            batch.non_tensor_batch[F.UID] = np.array([f"val{start}-{i}" for i in range(len(batch))], dtype=object)
            # The rollout draws a bar over the response tokens: a long validation shows progress.
            desc = f"validation {start + 1}/{batches}" if batches > 1 else f"validation ({len(batch)} prompts)"
            batch = self.generate(batch.repeat(vk.n, interleave=True), validate=True, progress_desc=desc)
            for name, value in batch.meta_info.pop(ROLLOUT_METRICS, {}).items():
                val_rollout.setdefault(f"val-aux/{name}", []).append(value)
            token_scores, extra = self.val_reward_fn(self.add_rm_scores(batch))
            row_scores = token_scores.sum(-1).tolist()
            sources += batch.non_tensor_batch[F.DATA_SOURCE].tolist()
            prompt_ids += batch.non_tensor_batch[F.UID].tolist()
            scores += row_scores
            preds += extra["pred"] if "pred" in extra else []
            for key, values in extra.items():
                extras.setdefault(key, []).extend(values)
            if keep_rows:
                rows += validation_rows(self.tokenizer, batch, row_scores, extra, self.global_steps)
        metrics = validation_metrics(sources, prompt_ids, scores, preds if len(preds) == len(scores) else None)
        metrics |= validation_extra_metrics(sources, prompt_ids, {k: v for k, v in extras.items() if k != "score"})
        means = [v for k, v in metrics.items() if k.startswith("val-core/") and "/mean@" in k]  # not val-aux's
        metrics["val-core/mean"] = float(np.mean(means)) if means else float("nan")
        metrics["timing_s/testing"] = time.perf_counter() - started
        metrics |= reduce_metrics(val_rollout)  # agent loops: val-aux/num_turns/*, ...
        if trainer_cfg.validation_data_dir:
            write_jsonl(Path(trainer_cfg.validation_data_dir) / f"{self.global_steps}.jsonl", rows)
        print_samples(rows, trainer_cfg.log_val_generations)
        return metrics

    # ------------------------------------------------------------------------------ bookkeeping
    def save_checkpoint(self) -> Path:
        """Actor (and critic) states, then the controller's, committed atomically."""
        trainer_cfg = self.config.trainer
        paths = ckpt.begin_checkpoint(trainer_cfg.default_local_dir, self.global_steps)
        self.workers.actor.save_checkpoint(str(paths.actor))
        if self.use_critic:
            self.workers.critic.save_checkpoint(str(paths.critic))
        ckpt.save_controller_state(paths.controller_state, self.controller_state())
        ckpt.commit_checkpoint(paths, self.global_steps, trainer_cfg.max_actor_ckpt_to_keep,
                               trainer_cfg.max_critic_ckpt_to_keep if self.use_critic else None)
        return paths.root

    def controller_state(self) -> dict[str, Any]:
        """What a checkpoint keeps of the controller (plain JSON values)."""
        return {"global_steps": self.global_steps, "dataloader": self.train_loader.state_dict(),
                "kl_ctrl": self.kl_ctrl.state_dict(), "rng": ckpt.rng_state()}

    def close(self) -> None:
        """Flush the loggers and stop the worker processes (Ray actors, reward scorers) of this run.

        Shutting the worker groups down drops the workers, and with them the models and
        optimizers (the shared-policy table and the rollout's step hook hold them only weakly);
        that happens even when flushing a logger fails, whose error is raised afterwards.
        """
        try:
            self.tracking.finish()
        finally:
            self.workers.rollout.close()  # the weight sync's connections / temporary files
            for group in self.workers.owners:
                group.shutdown()
            for service in self.services:
                service.close()
            for reward_fn in {id(fn): fn for fn in (self.reward_fn, self.val_reward_fn)}.values():
                close = getattr(reward_fn, "close", None)  # a plain function stands for a manager in tests
                if callable(close):
                    close()

    def load_checkpoint(self) -> None:
        """Restore the newest complete (or the configured) checkpoint; rewind the trackers to it."""
        trainer_cfg = self.config.trainer
        path = ckpt.find_resume_checkpoint(
            trainer_cfg.default_local_dir, trainer_cfg.resume_mode, trainer_cfg.resume_from_path
        )
        if path is not None:
            state = ckpt.load_controller_state(path, required=("global_steps", "dataloader", "kl_ctrl", "rng"))
            if self.use_critic and "critic" in ckpt.dropped_parts(path):
                raise ckpt.CheckpointError(
                    f"{path} keeps the actor only: its critic was pruned (trainer.max_critic_ckpt_to_keep); "
                    "resume from a newer checkpoint"
                )
            self.workers.actor.load_checkpoint(str(path / "actor"))
            if self.use_critic:
                self.workers.critic.load_checkpoint(str(path / "critic"))
            ckpt.restore_entry(path, state, "dataloader", self.train_loader.load_state_dict)
            ckpt.restore_entry(path, state, "kl_ctrl", self.kl_ctrl.load_state_dict)
            ckpt.restore_entry(path, state, "rng", ckpt.set_rng_state)
            self.global_steps = state["global_steps"]
            self.resumed_state = state
            self.sync_rollout_weights()  # the resumed weights, stamped
            print(f"resumed from {path} at step {self.global_steps}")
        self.tracking.rewind(self.global_steps + 1 if path is not None else 0)
