"""The SFT trainer: ``fit()`` is a short loop around ``train_step()``.

::

    fit():   resume (if a checkpoint exists) → for each batch:
               1 train_step   forward/backward over micro-batches (count or token budget),
                              one optimizer step, one lr-schedule step
               2 validate     mean NLL of the validation set, every test_freq steps and after the last
               3 log          tracking backends + progress bar (before the checkpoint commits)
               4 checkpoint   every save_freq steps and after the last
                              (global_step_N/actor, hf/, controller_state.json)

Metrics: ``train/loss`` (token-mean NLL of the step's batch), ``train/lr``, ``train/grad_norm``, ``train/skipped_step``,
``train/num_loss_tokens``, ``train/epoch``, ``val/loss``, ``timing_s/step``,
``perf/total_num_tokens``, ``perf/throughput`` (tokens per second).

Checkpoints use the PPO actor's layout, so the model merger reads them too::

    global_step_N/actor/      engine state (weights, optimizer, lr schedule, RNG), tokenizer/, hf_config/
    global_step_N/hf/         the model as a Hugging Face folder (LoRA merged), written by the
                              model merger: a model path for RL (actor_rollout_ref.model.path)
    global_step_N/controller_state.json   data position, step, RNG (JSON)

Resume is exact: the engine checkpoint restores weights, optimizer, lr schedule and RNG; the
controller state restores the data position, so stopping after step k and resuming gives the
same weights as an uninterrupted run. Metrics rows logged past the checkpoint by the stopped
run are dropped on resume (``Tracking.rewind``), so every step has exactly one row.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import torch
from tensordict import TensorDict
from tqdm import tqdm

from hybridflow import fields as FK
from hybridflow.config import SFTConfig
from hybridflow.data import StatefulDataLoader
from hybridflow.data.sft_dataset import LOSS_MASK
from hybridflow.engine import MicroBatchSpec, TrainEngine
from hybridflow.models.hf_metadata import HF_CONFIG_DIR, save_hf_metadata
from hybridflow.tracking import Tracking
from hybridflow.trainer import checkpoint as ckpt
from hybridflow.trainer.model_merger import TOKENIZER_DIR, merge_checkpoint
from hybridflow.trainer.sft_loss import LOG_PROBS, masked_nll_sum, sft_loss, token_log_probs

CHECKPOINT_KIND = "sft"
HF_FOLDER = "hf"


def to_tensordict(batch: dict[str, torch.Tensor]) -> TensorDict:
    """A collated SFT batch (``{name: (B, L) tensor}``) as a TensorDict with batch size B."""
    rows = int(batch[FK.INPUT_IDS].shape[0])
    return TensorDict(dict(batch), batch_size=[rows])


class SFTTrainer:
    """Fine-tunes ``engine.module`` on ``train_loader``'s examples.

    Args:
        config: the loaded (finalized) SFT config.
        engine: the training engine holding the model, optimizer and lr schedule.
        tokenizer: saved with every checkpoint.
        train_loader: resumable loader of collated ``SFTDataset`` rows (train_batch_size each).
        val_loader: loader over the validation set (``drop_last=False``), or None.
        tracking: where metrics go.
        total_training_steps: optimizer steps of the whole run (also the lr schedule's length).
        micro_batch: how each batch is split for forward/backward and for validation.
    """

    def __init__(
        self,
        config: SFTConfig,
        engine: TrainEngine,
        tokenizer: Any,
        train_loader: StatefulDataLoader,
        val_loader: StatefulDataLoader | None,
        tracking: Tracking,
        total_training_steps: int,
        micro_batch: MicroBatchSpec,
    ) -> None:
        if total_training_steps < 1:
            raise ValueError(f"total_training_steps must be ≥ 1, got {total_training_steps}")
        self.config = config
        self.engine = engine
        self.tokenizer = tokenizer
        self.train_loader = train_loader
        self.val_loader = val_loader
        self.tracking = tracking
        self.total_training_steps = total_training_steps
        self.micro_batch = micro_batch
        self.checkpoint_root = Path(config.trainer.default_local_dir)
        self.global_step = 0

    # ------------------------------------------------------------------------------ loop
    def fit(self) -> dict[str, float]:
        """Train until ``total_training_steps``; returns the last step's metrics."""
        self.load_checkpoint()
        if self.global_step >= self.total_training_steps:
            print(f"training already finished: step {self.global_step} of {self.total_training_steps}; nothing to do")
            return {}
        trainer_cfg = self.config.trainer
        last: dict[str, float] = {}
        progress = tqdm(total=self.total_training_steps, initial=self.global_step, desc="sft", unit="step")
        batches = self._train_batches()
        while self.global_step < self.total_training_steps:
            batch = to_tensordict(next(batches))
            self.global_step += 1
            last = self.train_step(batch)
            is_last = self.global_step == self.total_training_steps
            if self.val_loader is not None and (is_last or _due(trainer_cfg.test_freq, self.global_step)):
                last |= self.validate()
            self.tracking.log(last, step=self.global_step)  # before the commit: a saved step has its row
            if is_last or _due(trainer_cfg.save_freq, self.global_step):
                self.save_checkpoint()
            progress.set_postfix(_postfix(last))
            progress.update(1)
        progress.close()
        return last

    def _train_batches(self) -> Iterator[dict[str, torch.Tensor]]:
        """Batches across epochs, continuing from the loader's (possibly restored) position."""
        while True:
            yield from self.train_loader

    def train_step(self, batch: TensorDict) -> dict[str, float]:
        """One optimizer step on ``batch``; returns its metrics."""
        start = time.perf_counter()
        num_loss_tokens = int(batch[LOSS_MASK].sum())
        if num_loss_tokens == 0:
            raise ValueError(f"step {self.global_step}: the batch has no target token (every loss_mask is 0)")
        loss_fn = partial(sft_loss, batch_num_tokens=num_loss_tokens)
        micro_metrics = self.engine.forward_backward(batch, token_log_probs, loss_fn, self.micro_batch)
        result = self.engine.optimizer_step()
        self.engine.lr_scheduler_step()
        elapsed = time.perf_counter() - start
        total_tokens = int(batch[FK.ATTENTION_MASK].sum())
        return {
            "train/loss": float(sum(float(m["loss"]) for m in micro_metrics)),
            "train/lr": result.lr,
            "train/grad_norm": result.grad_norm,
            "train/skipped_step": float(result.skipped),
            "train/num_loss_tokens": float(num_loss_tokens),
            "train/epoch": float((self.global_step - 1) // max(len(self.train_loader), 1)),
            "timing_s/step": elapsed,
            "perf/total_num_tokens": float(total_tokens),
            "perf/throughput": total_tokens / max(elapsed, 1e-9),
        }

    # ------------------------------------------------------------------------------ validation
    def validate(self) -> dict[str, float]:
        """``val/loss``: token-mean NLL over every target token of the validation set."""
        if self.val_loader is None:
            return {}
        nll, tokens = 0.0, 0
        for batch_dict in self.val_loader:
            batch = to_tensordict(batch_dict)
            outputs = self.engine.infer(batch, token_log_probs, self.micro_batch)
            batch_nll, batch_tokens = masked_nll_sum(outputs[LOG_PROBS], batch[LOSS_MASK])
            nll, tokens = nll + batch_nll, tokens + batch_tokens
        return {"val/loss": nll / max(tokens, 1)}

    # ------------------------------------------------------------------------------ checkpoints
    def save_checkpoint(self) -> Path:
        """``actor/`` (engine state, tokenizer, HF config), ``hf/`` (exported), the controller state; atomic."""
        trainer_cfg = self.config.trainer
        paths = ckpt.begin_checkpoint(self.checkpoint_root, self.global_step)
        self.engine.save_checkpoint(paths.actor)
        save_hf_metadata(self.engine.module, paths.actor / HF_CONFIG_DIR)
        self.tokenizer.save_pretrained(paths.actor / TOKENIZER_DIR)
        if trainer_cfg.export_hf:
            merge_checkpoint(paths.actor, paths.staging / HF_FOLDER)
        state = {
            "kind": CHECKPOINT_KIND,
            "global_steps": self.global_step,
            "dataloader": self.train_loader.state_dict(),
            "rng": ckpt.rng_state(),
        }
        ckpt.save_controller_state(paths.controller_state, state)
        ckpt.commit_checkpoint(paths, self.global_step, trainer_cfg.max_ckpt_to_keep)
        return paths.root

    def load_checkpoint(self) -> Path | None:
        """Restore the newest complete (or the requested) checkpoint, if any, and rewind the
        trackers to it; returns its folder."""
        trainer_cfg = self.config.trainer
        path = ckpt.find_resume_checkpoint(self.checkpoint_root, trainer_cfg.resume_mode, trainer_cfg.resume_from_path)
        if path is not None:
            state = ckpt.load_controller_state(path)
            if state.get("kind") != CHECKPOINT_KIND:
                raise ValueError(f"{path} is not an SFT checkpoint (kind {state.get('kind')!r}); cannot resume SFT from it")
            self.engine.load_checkpoint(path / "actor")
            ckpt.restore_entry(path, state, "dataloader", self.train_loader.load_state_dict)
            ckpt.restore_entry(path, state, "rng", ckpt.set_rng_state)
            self.global_step = state["global_steps"]
            print(f"resumed from {path} at step {self.global_step}")
        self.tracking.rewind(self.global_step + 1 if path is not None else 0)
        return path


def _due(freq: int, step: int) -> bool:
    return freq > 0 and step % freq == 0


def _postfix(metrics: dict[str, float]) -> dict[str, str]:
    shown = {"loss": "train/loss", "val": "val/loss", "lr": "train/lr"}
    return {label: f"{metrics[key]:.4g}" for label, key in shown.items() if key in metrics}
