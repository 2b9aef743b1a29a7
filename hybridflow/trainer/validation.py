"""Validation through the producer: greedy (``val_kwargs``) responses on the whole validation
set, scored per data source (``val-core/*``, ``val-aux/*``), dumped to
``trainer.validation_data_dir`` and printed (``log_val_generations``) when set."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np

from hybridflow import fields as F
from hybridflow.protocol import DataProto
from hybridflow.trainer.generations import print_samples, validation_rows, write_jsonl
from hybridflow.trainer.metrics import reduce_metrics, validation_extra_metrics, validation_metrics
from hybridflow.trainer.producer import Producer


class ValidationRecord:
    """What the validation batches leave behind, in row order."""

    def __init__(self) -> None:
        self.sources: list[Any] = []
        self.prompt_ids: list[Any] = []
        self.scores: list[float] = []
        self.preds: list[Any] = []
        self.extras: dict[str, list[object]] = {}
        self.rows: list[dict[str, Any]] = []
        self.rollout: dict[str, list[float]] = {}

    def add(self, batch: DataProto, row_scores: list[float], extra: dict[str, list[Any]]) -> None:
        self.sources += batch.non_tensor_batch[F.DATA_SOURCE].tolist()
        self.prompt_ids += batch.non_tensor_batch[F.UID].tolist()
        self.scores += row_scores
        self.preds += extra["pred"] if "pred" in extra else []
        for key, values in extra.items():
            self.extras.setdefault(key, []).extend(values)

    def metrics(self) -> dict[str, float]:
        preds = self.preds if len(self.preds) == len(self.scores) else None
        metrics = validation_metrics(self.sources, self.prompt_ids, self.scores, preds)
        extras = {k: v for k, v in self.extras.items() if k != "score"}
        metrics |= validation_extra_metrics(self.sources, self.prompt_ids, extras)
        means = [v for k, v in metrics.items() if k.startswith("val-core/") and "/mean@" in k]  # not val-aux's
        metrics["val-core/mean"] = float(np.mean(means)) if means else float("nan")
        return metrics


def validate(producer: Producer, val_loader: Any, step: int) -> dict[str, float]:
    """Generate and score every validation prompt ``val_kwargs.n`` times with the current weights."""
    config, tokenizer = producer.config, producer.tokenizer
    vk, trainer_cfg = config.actor_rollout_ref.rollout.val_kwargs, config.trainer
    keep_rows = bool(trainer_cfg.validation_data_dir) or trainer_cfg.log_val_generations > 0
    started, batches = time.perf_counter(), len(val_loader)
    record = ValidationRecord()
    for start, batch_dict in enumerate(val_loader):
        batch = DataProto.from_single_dict(batch_dict)
        batch.non_tensor_batch[F.UID] = np.array([f"val{start}-{i}" for i in range(len(batch))], dtype=object)
        # The rollout draws a bar over the response tokens: a long validation shows progress.
        meta = producer.sampling_meta(step, validate=True)
        meta[F.META_PROGRESS_DESC] = (
            f"validation {start + 1}/{batches}" if batches > 1 else f"validation ({len(batch)} prompts)"
        )
        batch, rollout_metrics = producer.generate(batch.repeat(vk.n, interleave=True), meta)
        for name, value in rollout_metrics.items():
            record.rollout.setdefault(f"val-aux/{name}", []).append(value)
        token_scores, extra = producer.score(batch, validate=True)
        row_scores = token_scores.sum(-1).tolist()
        record.add(batch, row_scores, extra)
        if keep_rows:
            record.rows += validation_rows(tokenizer, batch, row_scores, extra, step)
    metrics = record.metrics()
    metrics["timing_s/testing"] = time.perf_counter() - started
    metrics |= reduce_metrics(record.rollout)  # agent loops: val-aux/num_turns/*, ...
    if trainer_cfg.validation_data_dir:
        write_jsonl(Path(trainer_cfg.validation_data_dir) / f"{step}.jsonl", record.rows)
    print_samples(record.rows, trainer_cfg.log_val_generations)
    return metrics
