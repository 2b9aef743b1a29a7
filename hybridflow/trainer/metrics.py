"""Per-step metrics with verl's names (critic/score/*, response_length/*, timing_s/*, perf/*)."""

from __future__ import annotations

import time
from collections import Counter, defaultdict
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from hybridflow import fields as F
from hybridflow.protocol import DataProto
from hybridflow.reward import RULE_SCORE


def _stats(prefix: str, values: torch.Tensor) -> dict[str, float]:
    if values.numel() == 0:
        return {}
    values = values.float()
    return {
        f"{prefix}/mean": values.mean().item(),
        f"{prefix}/max": values.max().item(),
        f"{prefix}/min": values.min().item(),
    }


def compute_data_metrics(batch: DataProto, use_critic: bool) -> dict[str, float]:
    """Scores, rewards, advantages, returns, values and lengths of one training batch."""
    td = batch.require_batch()
    mask = td[F.RESPONSE_MASK].bool()
    prompt_len = td[F.ATTENTION_MASK][:, : td[F.PROMPTS].shape[-1]].sum(-1).float()
    response_len = mask.sum(-1).float()
    max_response_len = td[F.RESPONSES].shape[-1]
    metrics: dict[str, float] = {}
    metrics |= _stats("critic/score", td[F.TOKEN_LEVEL_SCORES].sum(-1))
    metrics |= _stats("critic/rewards", td[F.TOKEN_LEVEL_REWARDS].sum(-1))
    if RULE_SCORE in batch.non_tensor_batch:  # reward_model.rule_reward=log|add: the rule's view of the same responses
        metrics |= _stats("critic/rule_score", torch.tensor(batch.non_tensor_batch[RULE_SCORE].astype(float)))
    metrics |= _stats("critic/advantages", td[F.ADVANTAGES][mask])
    metrics |= _stats("critic/returns", td[F.RETURNS][mask])
    if use_critic and F.VALUES in td.keys():
        values, returns = td[F.VALUES][mask], td[F.RETURNS][mask]
        metrics |= _stats("critic/values", values)
        var_returns = torch.var(returns.float())
        metrics["critic/vf_explained_var"] = (1.0 - torch.var((returns - values).float()) / (var_returns + 1e-5)).item()
    metrics |= _stats("response_length", response_len)
    metrics["response_length/clip_ratio"] = (response_len >= max_response_len).float().mean().item()
    metrics |= _stats("prompt_length", prompt_len)
    return metrics


def compute_throughput_metrics(batch: DataProto, step_time_s: float, num_workers: int = 1) -> dict[str, float]:
    total_tokens = int(batch.require_batch()[F.ATTENTION_MASK].sum().item())
    return {
        "perf/total_num_tokens": float(total_tokens),
        "perf/time_per_step": step_time_s,
        "perf/throughput": total_tokens / max(step_time_s, 1e-9) / num_workers,
    }


class Timer:
    """Collects ``timing_s/{phase}`` for the phases of one step."""

    def __init__(self) -> None:
        self.timings: dict[str, float] = {}

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.timings[name] = self.timings.get(name, 0.0) + time.perf_counter() - start

    def metrics(self) -> dict[str, float]:
        return {f"timing_s/{k}": v for k, v in self.timings.items()}


def reduce_metrics(metrics: Mapping[str, Sequence[float] | float]) -> dict[str, float]:
    """Mean of each list-valued metric (workers return per-micro-batch lists)."""
    out = {}
    for key, value in metrics.items():
        if isinstance(value, (list, tuple, np.ndarray)):
            arr = [_as_float(v) for v in value]
            out[key] = float(np.mean(arr)) if arr else float("nan")
        else:
            out[key] = _as_float(value)
    return out


def _as_float(value: Any) -> float:
    """A number, or a tensor / numpy scalar of one element (read with ``.item()``), as a float."""
    return float(value.item() if hasattr(value, "item") else value)


@dataclass(frozen=True)
class PromptStats:
    """Per-prompt reward statistics of one data source; each array has shape ``(P,)``.

    ``n`` is the most samples any prompt has. ``maj`` is None when no answers were given.
    """

    n: int
    mean: np.ndarray  # mean score of the prompt's samples
    best: np.ndarray  # highest score among them
    maj: np.ndarray | None  # score of the first sample giving the most common answer


def prompt_stats(
    data_sources: Sequence[str],
    prompt_ids: Sequence[object],
    scores: Sequence[float],
    preds: Sequence[object] | None = None,
) -> dict[str, PromptStats]:
    """Group samples by data source and prompt; per-prompt mean, best and majority-vote score.

    Majority vote compares answers as ``str(pred)``; a tie goes to the answer seen first.
    """
    groups: dict[str, dict[object, list[int]]] = defaultdict(lambda: defaultdict(list))
    for i, (source, pid) in enumerate(zip(data_sources, prompt_ids)):
        groups[source][pid].append(i)
    stats: dict[str, PromptStats] = {}
    for source, by_prompt in groups.items():
        means, bests, majs = [], [], []
        for idx in by_prompt.values():
            group_scores = [float(scores[i]) for i in idx]
            means.append(np.mean(group_scores))
            bests.append(np.max(group_scores))
            if preds is not None:
                votes = Counter(str(preds[i]) for i in idx)
                winner = votes.most_common(1)[0][0]
                majs.append(next(float(scores[i]) for i in idx if str(preds[i]) == winner))
        n = max(len(idx) for idx in by_prompt.values())
        maj = np.asarray(majs, dtype=np.float64) if preds is not None else None
        stats[source] = PromptStats(n, np.asarray(means, dtype=np.float64), np.asarray(bests, dtype=np.float64), maj)
    return stats


def validation_metrics(
    data_sources: Sequence[str],
    prompt_ids: Sequence[object],
    scores: Sequence[float],
    preds: Sequence[object] | None = None,
) -> dict[str, float]:
    """``val-core/{source}/reward/mean@N`` (and best@N, maj@N when N > 1) over prompts.

    ``prompt_ids`` groups the N samples of one prompt; ``preds`` (the extracted answers) feed
    the majority vote: maj@N is the score of the most common answer's first sample.
    """
    metrics: dict[str, float] = {}
    for source, stats in prompt_stats(data_sources, prompt_ids, scores, preds).items():
        base = f"val-core/{source}/reward"
        metrics[f"{base}/mean@{stats.n}"] = float(np.mean(stats.mean))
        if stats.n > 1:
            metrics[f"{base}/best@{stats.n}"] = float(np.mean(stats.best))
            if stats.maj is not None:
                metrics[f"{base}/maj@{stats.n}"] = float(np.mean(stats.maj))
    return metrics


def validation_extra_metrics(
    data_sources: Sequence[str], prompt_ids: Sequence[object], extra: Mapping[str, Sequence[object]]
) -> dict[str, float]:
    """``val-aux/{source}/{key}/mean@N`` for every numeric column the scorer returned besides the
    score (``acc``, ``formatted``, ``passed``, ``reward_error``, ...): the mean over prompts of
    the per-prompt mean, as for the reward. Columns with any non-number (``pred``) are skipped."""
    metrics: dict[str, float] = {}
    for key, values in extra.items():
        numbers = [v for v in values if isinstance(v, (int, float, np.integer, np.floating))]  # bools count as 0 / 1
        if len(values) != len(data_sources) or len(numbers) != len(values):
            continue
        for source, stats in prompt_stats(data_sources, prompt_ids, [float(v) for v in numbers]).items():
            metrics[f"val-aux/{source}/{key}/mean@{stats.n}"] = float(np.mean(stats.mean))
    return metrics
