"""The trainer core: one ``fit()`` loop for every mode of PPO-family training.

::

    prompts ──► Producer ──► ReplayBuffer ──► PolicyUpdate ──► weights ──► (sync to the rollout)
               phases 0–2     admission,        phases 3–7
               (producer.py)  filters, staleness (phases.py)
                              (buffer.py)

    fit():  resume → [validate] → for each step: step() → validate / log / checkpoint on schedule
    step(): batch   = schedule.next_batch()      sync: produce until one batch is buffered, take it,
                                                       then rollout.sleep() (free_cache_engine)
                                                 async: take the update's groups from the rollouter's buffer
            batch   = policy_update.run(batch)   old logp, ref, values, advantage, critic/actor updates
            schedule.after_update()              weight sync (every step, or every sync_every updates);
                                                 sync: rollout.wake_up(weights) → push → wake_up(kv_cache)

The schedule (``schedules/``) is the only thing that differs between ``sync``, ``one_step_off``
and ``fully_async``; validation (``validation.py``) and ReMax's greedy baseline use the same
producer, which is the one place a reward is computed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tqdm import tqdm

from hybridflow.config import PPOConfig
from hybridflow.protocol import DataProto
from hybridflow.tracking import Tracking
from hybridflow.trainer import checkpoint as ckpt
from hybridflow.trainer.generations import dump_rollouts
from hybridflow.trainer.metrics import Timer, compute_data_metrics, compute_throughput_metrics
from hybridflow.trainer.phases import PolicyUpdate, WorkerGroups, needs_reference
from hybridflow.trainer.producer import Producer, RewardFn
from hybridflow.trainer.schedules import make_schedule
from hybridflow.trainer.validation import validate


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
        self.train_loader = train_loader
        self.val_loader = val_loader
        self.tracking = tracking
        self.run_dir = Path(run_dir)
        self.total_training_steps = total_training_steps
        self.global_steps = 0
        self.services: list[Any] = []  # child processes of this run (a served judge), closed with it
        self.resumed_state: dict[str, Any] = {}  # the controller state of the checkpoint resumed from
        self.policy_update = PolicyUpdate(config, workers)
        self.producer = Producer(
            config,
            tokenizer,
            workers.rollout,
            reward_fn,
            val_reward_fn,
            rm=workers.rm,
            reward_baselines=self.policy_update.spec.needs_reward_baselines,
        )
        self.schedule = make_schedule(self)

    needs_reference = staticmethod(needs_reference)

    @property
    def use_critic(self) -> bool:
        return self.policy_update.use_critic

    # ------------------------------------------------------------------------------ loop
    def fit(self) -> dict[str, float]:
        """Train until ``total_training_steps``; returns the last step's metrics."""
        early = self.begin_fit()
        if early is not None:
            return early
        last: dict[str, float] = {}
        progress = tqdm(total=self.total_training_steps, initial=self.global_steps, desc="training", unit="step")
        self.schedule.start()
        try:
            while self.global_steps < self.total_training_steps:
                self.global_steps += 1
                last = self.end_step(self.step())
                progress.set_postfix(score=f"{last['critic/score/mean']:.3f}", step_s=f"{last['timing_s/step']:.1f}")
                progress.update(1)
        finally:
            self.schedule.stop()
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

    def step(self, prompts: DataProto | None = None) -> dict[str, float]:
        """One iteration of the algorithm at ``global_steps``; returns its metrics. ``prompts``:
        the step's first prompt batch (synchronous schedule; default: the training loader's next)."""
        timer = Timer()
        metrics: dict[str, float] = {}
        with timer.phase("step"):
            batch = self.schedule.next_batch(timer, metrics, prompts)
            batch = self.policy_update.run(batch, self.global_steps, timer, metrics)
            self.schedule.after_update(timer, metrics)
        metrics |= self.schedule.step_metrics()
        return self.step_metrics(batch, timer, metrics)

    def end_step(self, metrics: dict[str, float]) -> dict[str, float]:
        """Validation when due (its metrics join the step's), the step's log row, a checkpoint when due."""
        trainer_cfg = self.config.trainer
        is_last = self.global_steps == self.total_training_steps
        if (is_last or self._due(trainer_cfg.test_freq, is_last)) and self.val_loader is not None:
            with self.schedule.exclusive():
                metrics |= self.validate()
        self.tracking.log(metrics, step=self.global_steps)  # before the commit; rows past it: Tracking.rewind
        if self._due(trainer_cfg.save_freq, is_last):
            with self.schedule.exclusive():
                self.save_checkpoint()
        return metrics

    def _due(self, freq: int, is_last: bool) -> bool:
        return freq > 0 and (self.global_steps % freq == 0 or is_last)

    def step_metrics(self, batch: DataProto, timer: Timer, metrics: dict[str, float]) -> dict[str, float]:
        """The step's metrics: data, timing, throughput (and the rollout dump when asked)."""
        trainer = self.config.trainer
        if trainer.rollout_data_dir:
            dump_rollouts(
                trainer.rollout_data_dir,
                self.global_steps,
                self.tokenizer,
                batch,
                token_rows=trainer.rollout_token_rows,
            )
        metrics |= compute_data_metrics(batch, self.use_critic)
        metrics |= timer.metrics()
        metrics |= compute_throughput_metrics(batch, timer.timings["step"])
        metrics["training/global_step"] = float(self.global_steps)
        return metrics

    def validate(self) -> dict[str, float]:
        """Greedy responses on the validation set, scored (see :mod:`.validation`)."""
        return validate(self.producer, self.val_loader, self.global_steps)

    def sync_rollout_weights(self) -> dict[str, float]:
        """8: the rollout takes the actor's weights, stamped with the step (``weight_sync/*``)."""
        return self.schedule.sync_rollout_weights()

    # ------------------------------------------------------------------------------ bookkeeping
    def save_checkpoint(self) -> Path:
        """Actor (and critic) states, then the controller's, committed atomically."""
        trainer_cfg = self.config.trainer
        assert trainer_cfg.default_local_dir is not None  # filled when the config is loaded (resolve_ppo_config)
        paths = ckpt.begin_checkpoint(trainer_cfg.default_local_dir, self.global_steps)
        self.workers.actor.save_checkpoint(str(paths.actor))
        if self.use_critic:
            assert self.workers.critic is not None  # checked by PolicyUpdate
            self.workers.critic.save_checkpoint(str(paths.critic))
        ckpt.save_controller_state(paths.controller_state, self.controller_state())
        ckpt.commit_checkpoint(
            paths,
            self.global_steps,
            trainer_cfg.max_actor_ckpt_to_keep,
            trainer_cfg.max_critic_ckpt_to_keep if self.use_critic else None,
        )
        return paths.root

    def controller_state(self) -> dict[str, Any]:
        """What a checkpoint keeps of the controller (plain JSON values); an asynchronous
        schedule replaces the loader position with the first prompt not trained yet."""
        state = {
            "global_steps": self.global_steps,
            "dataloader": self.train_loader.state_dict(),
            "kl_ctrl": self.policy_update.kl_ctrl.state_dict(),
            "rng": ckpt.rng_state(),
        }
        return state | self.schedule.controller_state()

    def load_checkpoint(self) -> None:
        """Restore the newest complete (or the configured) checkpoint; rewind the trackers to it."""
        trainer_cfg = self.config.trainer
        assert trainer_cfg.default_local_dir is not None  # filled when the config is loaded (resolve_ppo_config)
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
                assert self.workers.critic is not None  # checked by PolicyUpdate
                self.workers.critic.load_checkpoint(str(path / "critic"))
            ckpt.restore_entry(path, state, "dataloader", self.train_loader.load_state_dict)
            ckpt.restore_entry(path, state, "kl_ctrl", self.policy_update.kl_ctrl.load_state_dict)
            ckpt.restore_entry(path, state, "rng", ckpt.set_rng_state)
            self.global_steps = state["global_steps"]
            self.resumed_state = state
            self.sync_rollout_weights()  # the resumed weights, stamped
            print(f"resumed from {path} at step {self.global_steps}")
        self.tracking.rewind(self.global_steps + 1 if path is not None else 0)

    def close(self) -> None:
        """Flush the loggers and stop the worker processes (Ray actors, reward scorers) of this run.

        Shutting the worker groups down drops the workers, and with them the models and
        optimizers (the shared-policy table and the rollout's step hook hold them only weakly).
        Every step runs even when an earlier one fails — a logger that cannot flush, a rollout
        worker that died (``WorkerError`` from its close) — and the first error is raised at the end.
        """
        reward_fns = {id(fn): fn for fn in (self.producer.reward_fn, self.producer.val_reward_fn)}.values()
        steps = [
            self.tracking.finish,
            self.workers.rollout.close,  # the weight sync's connections / temporary files
            *(group.shutdown for group in self.workers.owners),
            *(service.close for service in self.services),
            # a plain function stands for a reward manager in tests: nothing to close
            *(close for close in (getattr(fn, "close", None) for fn in reward_fns) if callable(close)),
        ]
        first_error: BaseException | None = None
        for step in steps:
            try:
                step()
            except BaseException as exc:  # noqa: BLE001 - the rest must still be shut down; re-raised below
                first_error = first_error or exc
        if first_error is not None:
            raise first_error
