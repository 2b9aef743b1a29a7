"""The loop shared by the supervised trainers (SFT, reward model): ``fit()`` around ``train_step()``.

::

    fit():   resume (if a checkpoint exists); validate at step 0 if validate_before_train()
             → for each batch:
               1 train_step   one optimizer step and one lr-schedule step (the subclass's loss)
               2 validate     every trainer.test_freq steps and after the last (the subclass's metrics)
               3 log          tracking backends + progress bar (before the checkpoint commits)
               4 checkpoint   every trainer.save_freq steps and after the last

A subclass supplies ``train_step``, ``validate``, ``save_model`` (what goes into the model
folder and ``hf/``), and as class attributes the checkpoint's ``kind``, its model folder, the
message for a checkpoint of another kind and the progress bar's postfix keys.

Checkpoint layout (written into a staging folder, then committed atomically)::

    global_step_N/<model_dir>/             engine state (weights, optimizer, lr schedule, RNG), ...
    global_step_N/hf/                      the model as a Hugging Face folder (trainer.export_hf)
    global_step_N/controller_state.json    kind, step, data position, RNG (JSON)

Resume is exact: the engine checkpoint restores weights, optimizer, lr schedule and RNG; the
controller state restores the data position, so stopping after step k and resuming gives the
same weights as an uninterrupted run. Metrics rows logged past the checkpoint by the stopped
run are dropped on resume (``Tracking.rewind``), so every step has exactly one row.

Data-parallel ranks (torchrun, :mod:`hybridflow.trainer.supervised.ranks`): every rank runs this
loop over the same global batches; the subclass's step trains on the rank's slice. Rank 0
alone logs, shows the progress bar, prints, and writes the controller state and commits a
checkpoint; the engine's sharded state is written by all ranks together into rank 0's staging
folder.

:func:`build_tracking` and :func:`fit_and_report` are the pieces of the two command lines
(``hybridflow sft``, ``hybridflow rm``) that do not depend on the trainer.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, ClassVar, Protocol

import torch
from tensordict import TensorDict
from tqdm import tqdm

from hybridflow.config.build import to_dict
from hybridflow.config.sft import SFTTrainerConfig
from hybridflow.data import StatefulDataLoader
from hybridflow.engine import MicroBatchSpec, StepResult, TrainEngine
from hybridflow.engine.fsdp_checkpoint import is_fsdp_checkpoint
from hybridflow.engine.torch_engine import TorchEngine
from hybridflow.tracking import Tracking
from hybridflow.trainer import checkpoint as ckpt
from hybridflow.trainer.supervised.one_process_checkpoint import load_one_process_checkpoint
from hybridflow.trainer.supervised.ranks import ONE_PROCESS, DataParallel
from hybridflow.utils.distributed import barrier, broadcast_object

HF_FOLDER = "hf"


class SupervisedConfig(Protocol):
    """What the loop reads of a trainer's config: a ``trainer`` section that is SFT's or extends it."""

    @property
    def trainer(self) -> SFTTrainerConfig: ...


class SupervisedTrainer:
    """Fits ``engine.module`` on ``train_loader``'s batches; subclasses define the step and the metrics.

    Args:
        config: the loaded (finalized) trainer config.
        engine: the training engine holding the model, optimizer and lr schedule.
        tokenizer: saved with every checkpoint (see ``save_model``).
        processor: a vision-language model's processor, saved in the tokenizer's place; None otherwise.
        train_loader: resumable loader of collated rows (train_batch_size each).
        val_loader: loader over the validation set (``drop_last=False``), or None.
        tracking: where metrics go.
        total_training_steps: optimizer steps of the whole run (also the lr schedule's length).
        micro_batch: how each batch is split for forward/backward and for validation.
        ranks: this process's data-parallel rank (torchrun); one process by default.
    """

    # the controller state's "kind": a checkpoint of another trainer is refused, not half-loaded;
    # also the progress bar's label
    kind: ClassVar[str]
    # the engine state's folder inside global_step_N
    model_dir: ClassVar[str]
    # CheckpointError message for a checkpoint of another kind; formatted with path= and kind=
    wrong_kind_message: ClassVar[str]
    # progress-bar label → metric key, shown when the step's metrics have it
    postfix_keys: ClassVar[dict[str, str]]

    @staticmethod
    def batch_to_tensordict(batch: dict[str, torch.Tensor]) -> TensorDict:
        """A collated batch (``{name: (B, L) tensor}``) as the TensorDict train_step takes."""
        raise NotImplementedError

    def __init__(
        self,
        config: SupervisedConfig,
        engine: TrainEngine,
        tokenizer: Any,
        train_loader: StatefulDataLoader,
        val_loader: StatefulDataLoader | None,
        tracking: Tracking,
        total_training_steps: int,
        micro_batch: MicroBatchSpec,
        ranks: DataParallel = ONE_PROCESS,
        processor: Any = None,
    ) -> None:
        if total_training_steps < 1:
            raise ValueError(f"total_training_steps must be ≥ 1, got {total_training_steps}")
        self.config = config
        self.engine = engine
        self.tokenizer = tokenizer
        self.processor = processor
        self.train_loader = train_loader
        self.val_loader = val_loader
        self.tracking = tracking
        self.total_training_steps = total_training_steps
        self.micro_batch = micro_batch
        self.ranks = ranks
        run_dir = config.trainer.default_local_dir
        assert run_dir is not None  # filled when the config is loaded (resolve_seed_and_run_dir)
        self.checkpoint_root = Path(run_dir)
        self.global_step = 0

    # ------------------------------------------------------------------------------ subclass hooks
    def train_step(self, batch: TensorDict) -> dict[str, float]:
        """One optimizer step on ``batch``; returns its metrics."""
        raise NotImplementedError

    def validate(self) -> dict[str, float]:
        """Metrics over the whole validation set (``{}`` without one)."""
        raise NotImplementedError

    def save_model(self, staging: Path) -> None:
        """Write ``staging/<model_dir>`` (at least the engine state) and, when ``trainer.export_hf``
        is set, ``staging/hf``: the model part of a checkpoint, before the commit."""
        raise NotImplementedError

    def validate_before_train(self) -> bool:
        """Whether a fresh run (step 0) validates once before training, logged at step 0."""
        return False

    def step_metrics(self, result: StepResult, elapsed: float, tokens: int) -> dict[str, float]:
        """The metrics every trainer's ``train_step`` reports besides its losses: the optimizer
        step's ``result``, the epoch, the step's wall time ``elapsed`` (s) and its ``tokens``."""
        return {
            "train/lr": result.lr,
            "train/grad_norm": result.grad_norm,
            "train/skipped_step": float(result.skipped),
            "train/epoch": float((self.global_step - 1) // max(len(self.train_loader), 1)),
            "timing_s/step": elapsed,
            "perf/total_num_tokens": float(tokens),
            "perf/throughput": tokens / max(elapsed, 1e-9),
        }

    # ------------------------------------------------------------------------------ loop
    def fit(self) -> dict[str, float]:
        """Train until ``total_training_steps``; returns the last step's metrics."""
        self.load_checkpoint()
        if self.global_step >= self.total_training_steps:
            self._print(
                f"training already finished: step {self.global_step} of {self.total_training_steps}; nothing to do"
            )
            return {}
        trainer_cfg = self.config.trainer
        if self.global_step == 0 and self.val_loader is not None and self.validate_before_train():
            self.tracking.log(self.validate(), step=0)
        last: dict[str, float] = {}
        progress = tqdm(
            total=self.total_training_steps,
            initial=self.global_step,
            desc=self.kind,
            unit="step",
            disable=not self.ranks.is_main,
        )
        batches = self._train_batches()
        try:
            while self.global_step < self.total_training_steps:
                batch = self.batch_to_tensordict(next(batches))
                self.global_step += 1
                last = self.train_step(batch)
                is_last = self.global_step == self.total_training_steps
                if self.val_loader is not None and (is_last or _due(trainer_cfg.test_freq, self.global_step)):
                    last |= self.validate()
                self.tracking.log(last, step=self.global_step)  # before the commit: a saved step has its row
                if is_last or _due(trainer_cfg.save_freq, self.global_step):
                    self.save_checkpoint()
                progress.set_postfix(self._postfix(last))
                progress.update(1)
        finally:
            progress.close()  # ends the bar's line, so an error message starts on its own
        return last

    def _train_batches(self) -> Iterator[dict[str, torch.Tensor]]:
        """Batches across epochs, continuing from the loader's (possibly restored) position."""
        while True:
            yield from self.train_loader

    def _print(self, message: str) -> None:
        if self.ranks.is_main:
            print(message)

    def _postfix(self, metrics: dict[str, float]) -> dict[str, str]:
        return {label: f"{metrics[key]:.4g}" for label, key in self.postfix_keys.items() if key in metrics}

    # ------------------------------------------------------------------------------ checkpoints
    def save_checkpoint(self) -> Path:
        """The model part (:meth:`save_model`) and the controller state, committed atomically.
        With several ranks: rank 0 stages and commits, every rank takes part in ``save_model``."""
        trainer_cfg = self.config.trainer
        main = self.ranks.is_main
        paths = ckpt.begin_checkpoint(self.checkpoint_root, self.global_step) if main else None
        paths = broadcast_object(paths)
        assert paths is not None  # rank 0's, on every rank
        self.save_model(paths.staging)
        if main:
            state = {
                "kind": self.kind,
                "global_steps": self.global_step,
                "dataloader": self.train_loader.state_dict(),
                "rng": ckpt.rng_state(),
            }
            ckpt.save_controller_state(paths.controller_state, state)
            ckpt.commit_checkpoint(paths, self.global_step, trainer_cfg.max_ckpt_to_keep)
        barrier()  # no rank goes on (or resumes, or exits) before the commit
        return paths.root

    def load_checkpoint(self) -> Path | None:
        """Restore the newest complete (or the requested) checkpoint, if any, and rewind the
        trackers to it; returns its folder. A checkpoint of another kind raises CheckpointError."""
        trainer_cfg = self.config.trainer
        path = None
        if self.ranks.is_main:  # one choice for all ranks (a damaged newest checkpoint is skipped once)
            path = ckpt.find_resume_checkpoint(
                self.checkpoint_root, trainer_cfg.resume_mode, trainer_cfg.resume_from_path
            )
        path = broadcast_object(path)
        if path is not None:
            state = ckpt.load_controller_state(path)
            if state.get("kind") != self.kind:
                raise ckpt.CheckpointError(self.wrong_kind_message.format(path=path, kind=state.get("kind")))
            self._load_engine_state(path / self.model_dir, state["global_steps"])
            ckpt.restore_entry(path, state, "dataloader", self.train_loader.load_state_dict)
            ckpt.restore_entry(path, state, "rng", ckpt.set_rng_state)
            self.global_step = state["global_steps"]
            self._print(f"resumed from {path} at step {self.global_step}")
        self.tracking.rewind(self.global_step + 1 if path is not None else 0)
        return path

    def _load_engine_state(self, folder: Path, step: int) -> None:
        """The engine's state from ``folder``. A one-process checkpoint (the torch engine's files)
        also loads into the sharded engine of a torchrun run; a sharded one needs torchrun."""
        sharded = is_fsdp_checkpoint(folder)
        if sharded and not self.engine.shards_parameters:
            raise ckpt.CheckpointError(
                f"{folder} is a sharded checkpoint written by several ranks; resume it under torchrun "
                "(`torchrun --nproc_per_node=N -m hybridflow.entrypoints...`, any N, 1 included)"
            )
        if not sharded and isinstance(self.engine, TorchEngine) and self.engine.shards_parameters:
            load_one_process_checkpoint(self.engine, folder, step)
            return
        self.engine.load_checkpoint(folder)


def _due(freq: int, step: int) -> bool:
    return freq > 0 and step % freq == 0


# ---------------------------------------------------------------------------------- command lines
def build_tracking(config: SupervisedConfig, ranks: DataParallel = ONE_PROCESS) -> Tracking:
    """The run folder (``trainer.default_local_dir``, created) and its trackers: ``trainer.logger``
    plus jsonl, with the whole config recorded. Ranks other than 0 get no tracker at all."""
    trainer_cfg = config.trainer
    assert trainer_cfg.default_local_dir is not None  # filled when the config is loaded (resolve_seed_and_run_dir)
    run_dir = Path(trainer_cfg.default_local_dir)
    if not ranks.is_main:
        return Tracking([], run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    loggers = list(dict.fromkeys([*trainer_cfg.logger, "jsonl"]))  # metrics.jsonl: curves and comparisons
    return Tracking(loggers, run_dir, trainer_cfg.project_name, trainer_cfg.experiment_name, config=to_dict(config))


def fit_and_report(trainer: SupervisedTrainer, describe_export: Callable[[Path], str]) -> dict[str, float]:
    """Fit (the trackers are finished even if it fails); print the run folder and, when the last
    checkpoint has one, ``describe_export(hf folder)``. Returns the last step's metrics."""
    try:
        metrics = trainer.fit()
    finally:
        trainer.tracking.finish()
    if not trainer.ranks.is_main:
        return metrics
    print(f"run folder: {trainer.checkpoint_root} (metrics.jsonl, checkpoints)")
    hf = trainer.checkpoint_root / f"global_step_{trainer.global_step}" / HF_FOLDER
    if hf.is_dir():
        print(describe_export(hf))
    return metrics
