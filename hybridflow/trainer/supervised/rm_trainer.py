"""The reward-model trainer: the supervised loop (:mod:`hybridflow.trainer.supervised.base`) with
the Bradley–Terry loss on preference pairs.

What is the reward model's own:

* ``train_step``: both replies of each pair through the model in the same micro-batch,
  Bradley–Terry loss (rm_loss.py), one optimizer and lr-schedule step;
* ``validate``: ``val/loss``, ``val/accuracy``, ``val/margin`` over the whole validation set, every
  ``trainer.test_freq`` steps and after the last, and once before training when
  ``trainer.val_before_train`` is set (logged at step 0).

Metrics: ``train/loss`` (mean −log σ(r_c − r_r) of the step's pairs), ``train/accuracy`` (fraction
with r_c > r_r), ``train/margin`` (mean r_c − r_r), ``train/lr``, ``train/grad_norm``,
``train/skipped_step``, ``train/epoch``, ``timing_s/step``, ``perf/total_num_tokens``,
``perf/throughput``; ``val/loss``, ``val/accuracy``, ``val/margin`` over the whole validation set.

Checkpoint layout (checkpoints every ``trainer.save_freq`` steps and after the last, the newest
``trainer.max_ckpt_to_keep`` kept; resume per ``trainer.resume_mode``)::

    global_step_N/reward_model/         engine state: weights, optimizer, lr schedule, RNG
    global_step_N/hf/                   the reward model as a Hugging Face folder (LoRA merged,
                                        tokenizer included): load_reward_model(path) loads it
    global_step_N/controller_state.json data position, step, RNG (JSON)

Resume is exact (see the shared loop); a checkpoint of another kind (SFT, PPO) is refused.

Under torchrun each rank trains on its slice of every batch of pairs (``ranks.rank_rows``) with
the pair count N summed over ranks, and validation batches are split over the ranks too; the
metrics are sums over ranks, logged by rank 0. The ``hf/`` export needs the whole model: the
shards are gathered into ``unsharded_copy``, a CPU copy rank 0 keeps for that purpose.
"""

from __future__ import annotations

import copy
import time
from functools import partial
from pathlib import Path
from typing import Any

import torch
from tensordict import TensorDict
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

from hybridflow import fields as FK
from hybridflow.config.rm import RMConfig
from hybridflow.data.pair_dataset import CHOSEN_ATTENTION_MASK, REJECTED_ATTENTION_MASK
from hybridflow.export.reader import merged_model
from hybridflow.export.writer import save_model, write_export
from hybridflow.models.hf_metadata import split_peft
from hybridflow.trainer.supervised.base import HF_FOLDER, SupervisedTrainer
from hybridflow.trainer.supervised.ranks import global_sum, padded_rank_rows, rank_rows
from hybridflow.trainer.supervised.rm_loss import (
    CHOSEN_REWARDS,
    REJECTED_REWARDS,
    pair_rewards,
    pair_sums,
    rm_loss,
)

CHECKPOINT_KIND = "rm"
MODEL_DIR = "reward_model"
PAIR_METRICS: tuple[str, ...] = ("loss", "accuracy", "margin")


def to_tensordict(batch: dict[str, torch.Tensor]) -> TensorDict:
    """A collated batch of pairs (``{name: (B, L) tensor}``) as a TensorDict with batch size B."""
    return TensorDict(dict(batch), batch_size=[int(batch[FK.ATTENTION_MASK].shape[0])])


def export_reward_model(module: torch.nn.Module, tokenizer: Any, target: Path) -> Path:
    """Write ``module`` (LoRA merged into a copy; the live module is untouched) and ``tokenizer``
    as a Hugging Face folder whose ``config.architectures`` names the *ForSequenceClassification class."""

    def write(folder: Path) -> None:
        _, adapter = split_peft(module)
        model = merged_model(copy.deepcopy(module)) if adapter is not None else module
        save_model(model, folder)
        tokenizer.save_pretrained(folder)

    write_export(target, {}, write)
    return target


class RMTrainer(SupervisedTrainer):
    """Trains ``engine.module`` (a 1-output sequence-classification model) on preference pairs
    (collated ``PairDataset`` rows).

    Constructor arguments: see :class:`~hybridflow.trainer.supervised.base.SupervisedTrainer`.
    """

    config: RMConfig
    kind = CHECKPOINT_KIND
    model_dir = MODEL_DIR
    wrong_kind_message = (
        "{path} is not a reward-model checkpoint (kind {kind!r}); cannot resume `hybridflow rm` "
        "from it (to start from a trained reward model, set model.path to its hf/ folder)"
    )
    postfix_keys = {"loss": "train/loss", "acc": "train/accuracy", "val_acc": "val/accuracy", "lr": "train/lr"}
    batch_to_tensordict = staticmethod(to_tensordict)
    # with a sharded engine: rank 0's unsharded CPU copy of the module, which the hf/ export
    # loads the gathered weights into (set by the entry point; None on the other ranks)
    unsharded_copy: torch.nn.Module | None = None

    def validate_before_train(self) -> bool:
        """``trainer.val_before_train``: a baseline row (the fresh head's accuracy) at step 0."""
        return self.config.trainer.val_before_train

    def train_step(self, batch: TensorDict) -> dict[str, float]:
        """One optimizer step on a batch of pairs; returns its metrics."""
        start = time.perf_counter()
        local = rank_rows(batch, self.ranks)
        local_tokens = float(local[CHOSEN_ATTENTION_MASK].sum() + local[REJECTED_ATTENTION_MASK].sum())
        pairs, tokens = global_sum([float(local.batch_size[0]), local_tokens])
        loss_fn = partial(rm_loss, batch_num_pairs=int(pairs), dp_size=self.ranks.world_size)
        micro_metrics = self.engine.forward_backward(local, pair_rewards, loss_fn, self.micro_batch)
        result = self.engine.optimizer_step()
        self.engine.lr_scheduler_step()
        elapsed = time.perf_counter() - start
        sums = global_sum([sum(float(m[name]) for m in micro_metrics) for name in PAIR_METRICS])
        shares = {f"train/{name}": value for name, value in zip(PAIR_METRICS, sums, strict=True)}
        return shares | self.step_metrics(result, elapsed, int(tokens))

    def validate(self) -> dict[str, float]:
        """``val/loss``, ``val/accuracy``, ``val/margin``: means over every validation pair."""
        if self.val_loader is None:
            return {}
        totals = dict.fromkeys(PAIR_METRICS, 0.0)
        pairs = 0
        for batch_dict in self.val_loader:
            batch, real = padded_rank_rows(to_tensordict(batch_dict), self.ranks)
            outputs = self.engine.infer(batch, pair_rewards, self.micro_batch)
            chosen, rejected = outputs[CHOSEN_REWARDS][:real], outputs[REJECTED_REWARDS][:real]
            for name, value in pair_sums(chosen, rejected).items():
                totals[name] += float(value)
            pairs += real
        *sums, count = global_sum([*totals.values(), float(pairs)])
        return {f"val/{name}": total / max(count, 1.0) for name, total in zip(totals, sums, strict=True)}

    def save_model(self, staging: Path) -> None:
        """``reward_model/`` (engine state) and, with ``trainer.export_hf``, ``hf/`` (:func:`export_reward_model`).
        The engine state is written by every rank (collective), ``hf/`` by rank 0."""
        self.engine.save_checkpoint(staging / MODEL_DIR)
        if not self.config.trainer.export_hf:
            return
        module = self.engine.module
        if self.engine.shards_parameters:
            # every rank takes part in the gather; only rank 0 receives the full tensors
            full = get_model_state_dict(module, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
            if not self.ranks.is_main:
                return
            if self.unsharded_copy is None:
                raise RuntimeError("a sharded reward model needs RMTrainer.unsharded_copy on rank 0 to export hf/")
            self.unsharded_copy.load_state_dict(full)
            module = self.unsharded_copy
        export_reward_model(module, self.tokenizer, staging / HF_FOLDER)
