"""The SFT trainer: the supervised loop (:mod:`hybridflow.trainer.supervised.base`) with the NLL loss.

What is SFT's own:

* ``train_step``: forward/backward over micro-batches (count or token budget; rows padded, or
  packed into one row per micro-batch with ``model.use_remove_padding``, see
  :mod:`hybridflow.trainer.supervised.sft_loss`) with the token-mean NLL of the batch's target
  tokens (``loss_mask``), one optimizer step, one lr-schedule step;
* ``validate``: ``val/loss``, the mean NLL over every target token of the validation set
  (every test_freq steps and after the last; no validation at step 0).

Metrics: ``train/loss`` (token-mean NLL of the step's batch), ``train/lr``, ``train/grad_norm``, ``train/skipped_step``,
``train/num_loss_tokens``, ``train/epoch``, ``val/loss``, ``timing_s/step``,
``perf/total_num_tokens``, ``perf/throughput`` (tokens per second).

Checkpoints use the PPO actor's layout, so the model merger reads them too::

    global_step_N/actor/      engine state (weights, optimizer, lr schedule, RNG), tokenizer/, hf_config/
    global_step_N/hf/         the model as a Hugging Face folder (LoRA merged), written by the
                              model merger: a model path for RL (actor_rollout_ref.model.path)
    global_step_N/controller_state.json   data position, step, RNG (JSON)

Resume is exact (see the shared loop); a checkpoint of another kind (PPO, reward model) is refused.

Under torchrun each rank trains on its slice of every batch (``ranks.rank_rows``) with the
target-token count N summed over ranks, and each validation batch is split over the ranks
too; the metrics are sums over ranks, the same on every rank, logged by rank 0.
"""

from __future__ import annotations

import time
from functools import partial
from pathlib import Path
from typing import Any

from tensordict import TensorDict

from hybridflow import fields as FK
from hybridflow.config import SFTConfig
from hybridflow.data.sft_dataset import LOSS_MASK
from hybridflow.engine.multimodal_inputs import with_multi_modal_inputs
from hybridflow.export.reader import TOKENIZER_DIR
from hybridflow.export.writer import merge_checkpoint
from hybridflow.models.hf_metadata import HF_CONFIG_DIR, save_hf_metadata
from hybridflow.models.processor import save_tokenizer_or_processor
from hybridflow.trainer.supervised.base import HF_FOLDER, SupervisedTrainer
from hybridflow.trainer.supervised.ranks import global_sum, padded_rank_rows, rank_rows
from hybridflow.trainer.supervised.sft_loss import (
    LOG_PROBS,
    masked_nll_sum,
    sft_loss,
    token_log_probs,
)

CHECKPOINT_KIND = "sft"
MODEL_DIR = "actor"  # the PPO actor's folder: the model merger and RL read SFT checkpoints as they are


def to_tensordict(batch: dict[str, Any]) -> TensorDict:
    """A collated SFT batch (``{name: (B, L) tensor}``, plus one ``multi_modal_inputs`` dict per
    row for image conversations) as a TensorDict with batch size B."""
    rows = int(batch[FK.INPUT_IDS].shape[0])
    out = TensorDict({k: v for k, v in batch.items() if k != FK.MULTI_MODAL_INPUTS}, batch_size=[rows])
    images = batch.get(FK.MULTI_MODAL_INPUTS)
    return out if images is None else with_multi_modal_inputs(out, list(images))


class SFTTrainer(SupervisedTrainer):
    """Fine-tunes ``engine.module`` on ``train_loader``'s examples (collated ``SFTDataset`` rows).

    Constructor arguments: see :class:`~hybridflow.trainer.supervised.base.SupervisedTrainer`.
    """

    config: SFTConfig
    kind = CHECKPOINT_KIND
    model_dir = MODEL_DIR
    wrong_kind_message = "{path} is not an SFT checkpoint (kind {kind!r}); cannot resume SFT from it"
    postfix_keys = {"loss": "train/loss", "val": "val/loss", "lr": "train/lr"}
    batch_to_tensordict = staticmethod(to_tensordict)

    def train_step(self, batch: TensorDict) -> dict[str, float]:
        """One optimizer step on ``batch``; returns its metrics."""
        start = time.perf_counter()
        world = self.ranks.world_size
        local = rank_rows(batch, self.ranks)
        loss_tokens, tokens = global_sum([float(local[LOSS_MASK].sum()), float(local[FK.ATTENTION_MASK].sum())])
        num_loss_tokens, total_tokens = int(loss_tokens), int(tokens)
        if num_loss_tokens == 0:
            raise ValueError(f"step {self.global_step}: the batch has no target token (every loss_mask is 0)")
        loss_fn = partial(sft_loss, batch_num_tokens=num_loss_tokens, dp_size=world)
        micro_metrics = self.engine.forward_backward(local, token_log_probs, loss_fn, self.micro_batch)
        result = self.engine.optimizer_step()
        self.engine.lr_scheduler_step()
        elapsed = time.perf_counter() - start
        # each rank's shares carry × world (the gradient average takes it out again)
        (loss_sum,) = global_sum([sum(float(m["loss"]) for m in micro_metrics)])
        return {
            "train/loss": loss_sum / world,
            "train/num_loss_tokens": float(num_loss_tokens),
            **self.step_metrics(result, elapsed, total_tokens),
        }

    def validate(self) -> dict[str, float]:
        """``val/loss``: token-mean NLL over every target token of the validation set."""
        if self.val_loader is None:
            return {}
        nll, tokens = 0.0, 0
        for batch_dict in self.val_loader:
            batch, real = padded_rank_rows(to_tensordict(batch_dict), self.ranks)
            outputs = self.engine.infer(batch, token_log_probs, self.micro_batch)
            batch_nll, batch_tokens = masked_nll_sum(outputs[LOG_PROBS][:real], batch[LOSS_MASK][:real])
            nll, tokens = nll + batch_nll, tokens + batch_tokens
        nll, total = global_sum([nll, float(tokens)])
        return {"val/loss": nll / max(total, 1.0)}

    def save_model(self, staging: Path) -> None:
        """``actor/`` (engine state, tokenizer, HF config) and, with ``trainer.export_hf``, ``hf/``
        (the model merger's export of ``actor/``). The engine state is written by every rank
        (collective), the rest by rank 0 from the finished shards."""
        actor = staging / MODEL_DIR
        self.engine.save_checkpoint(actor)
        if not self.ranks.is_main:
            return
        save_hf_metadata(self.engine.module, actor / HF_CONFIG_DIR)
        save_tokenizer_or_processor(self.tokenizer, self.processor, actor / TOKENIZER_DIR)
        if self.config.trainer.export_hf:
            merge_checkpoint(actor, staging / HF_FOLDER)
