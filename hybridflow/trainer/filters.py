"""Buffer-side filters. DAPO dynamic sampling (``algorithm.filter_groups``): keep only prompt
groups whose responses differ.

A group whose n responses all score the same has zero advantage under group-normalised
estimators (GRPO, DAPO, RLOO): it adds rows to the update but no gradient. DAPO (Yu et al.,
2025, arXiv:2503.14476, §3.2) drops such groups and samples further prompt batches until
``data.train_batch_size`` groups with varied scores are collected. The filter runs where
samples enter the replay buffer (:func:`group_filter`), so every schedule — synchronous,
one-step-off, fully asynchronous — uses it; :func:`too_few_groups` is the shared give-up rule.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from hybridflow import fields as F
from hybridflow.config import PPOConfig
from hybridflow.reward import scored_extra_floats

SUMMED_SCORE_METRICS = ("score", "seq_reward")  # the response's summed token-level score
SUMMED_REWARD_METRIC = "seq_final_reward"  # summed token-level reward (= score without KL in reward)


def response_metric(batch: Any, metric: str) -> np.ndarray:
    """(B,) float values of ``metric`` per response: a summed score, or a key the scorer
    returned (a non-tensor column of the batch, e.g. ``acc``)."""
    if metric in SUMMED_SCORE_METRICS or metric == SUMMED_REWARD_METRIC:
        return batch.batch[F.TOKEN_LEVEL_SCORES].sum(-1).to(torch.float64).numpy()
    if metric not in batch.non_tensor_batch:
        raise ValueError(
            f"algorithm.filter_groups.metric={metric!r} is neither a summed score "
            f"({', '.join(SUMMED_SCORE_METRICS + (SUMMED_REWARD_METRIC,))}) nor a key the scorer returned "
            f"(this batch has: {', '.join(sorted(batch.non_tensor_batch)) or 'none'})"
        )
    values = scored_extra_floats(batch.non_tensor_batch, metric, f"algorithm.filter_groups.metric={metric!r}")
    return np.asarray(values, dtype=np.float64)


def varied_group_rows(values: np.ndarray, uids: np.ndarray) -> tuple[np.ndarray, int]:
    """``(rows to keep, number of groups kept)``: the rows of every group (rows sharing a uid)
    whose ``values`` are not all equal, and of single-response groups (nothing to compare).

    Rows keep their order. Example: values [1, 1, 0, 1, 0, 0] with uids [a, a, b, b, c, c]
    → rows [2, 3], one group (b).
    """
    if values.shape != uids.shape:
        raise ValueError(f"{values.shape[0]} metric values for {uids.shape[0]} rows")
    groups: dict[Any, list[int]] = {}
    for row, uid in enumerate(uids):
        groups.setdefault(uid, []).append(row)
    kept = [uid for uid, rows in groups.items() if len(rows) == 1 or np.std(values[rows]) > 0]
    keep = set(kept)
    return np.asarray([row for row, uid in enumerate(uids) if uid in keep], dtype=np.int64), len(kept)


def group_filter(config: PPOConfig) -> Callable[[Any], tuple[np.ndarray, int]] | None:
    """The replay buffer's admission filter for ``algorithm.filter_groups`` (None when off)."""
    cfg = config.algorithm.filter_groups
    if not cfg.enable:
        return None

    def keep_varied(batch: Any) -> tuple[np.ndarray, int]:
        return varied_group_rows(response_metric(batch, cfg.metric), batch.non_tensor_batch[F.UID])

    return keep_varied


def too_few_groups(config: PPOConfig, gen_batches: int, groups: int, want: int) -> RuntimeError | None:
    """The error to raise when ``gen_batches`` generation batches have left only ``groups`` of
    ``want`` varied groups and ``filter_groups.max_num_gen_batches`` allows no more (else None)."""
    cfg = config.algorithm.filter_groups
    if groups >= want or not 0 < cfg.max_num_gen_batches <= gen_batches:
        return None
    return RuntimeError(
        f"DAPO dynamic sampling: {gen_batches} generation batches left only {groups} of "
        f"{want} prompt groups whose responses differ in {cfg.metric!r}; the task may be too easy "
        "or too hard for the model. Raise algorithm.filter_groups.max_num_gen_batches (≤ 0: no limit) "
        "or check the data and the reward."
    )
