"""Offline evaluation: score a file of generated responses per data source (verl's ``main_eval``).

The command is ``hybridflow eval`` (:mod:`hybridflow.entrypoints.eval`).

Input: a parquet or JSON-lines file, one row per prompt, with ``responses`` (a list of N
response strings, as ``hybridflow generate`` writes it) and verl's RL columns ``data_source``,
``reward_model.ground_truth`` and optionally ``extra_info``. Every response is scored with the
reward layer (built-in scorers or a custom function, through the fault-contained executors:
a scorer that raises or hangs scores 0 and is counted). Per data source, over its P prompts:

* ``mean@N`` — mean over prompts of the prompt's mean score;
* ``best@N`` — mean over prompts of the prompt's best score (N > 1);
* ``maj@N``  — mean over prompts of the score of the most common extracted answer (N > 1, and
  only when the scorer returns a dict with ``pred`` for every response of that source).

Error bars come from a seeded bootstrap over prompts: B resamples of P prompts drawn with
replacement; ``std`` is the standard deviation of the B resampled metrics (the standard error)
and ``ci_low``/``ci_high`` the central ``confidence`` interval of them. The table is printed and
the full report written as JSON (default: next to the input, ``<name>.eval.json``).
"""

from __future__ import annotations

import json
import logging
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from hybridflow import fields as F
from hybridflow.config import ConfigError, CustomRewardFunctionConfig, load_structured
from hybridflow.config.build import check_leaves
from hybridflow.config.spec import section, setting
from hybridflow.data import DataFileError, DataRowError, read_rows
from hybridflow.reward import (
    EXECUTORS,
    REWARD_MANAGERS,
    CustomRewardFunction,
    ScoreItem,
    ScoreOutcome,
)
from hybridflow.reward.base import check_known_sources
from hybridflow.reward.executors import ERROR, OK, TIMEOUT
from hybridflow.trainer.metrics import PromptStats, prompt_stats, validation_metrics

logger = logging.getLogger("hybridflow.eval")

PRED = "pred"  # the key a scorer's dict result uses for its extracted answer
GROUND_TRUTH = "ground_truth"


# --- config --------------------------------------------------------------------------------


@dataclass(frozen=True)
class EvalDataConfig:
    """``data``: the file of responses and its column names (verl's names)."""

    path: str | None = setting(None, "parquet or jsonl file with a responses column (required)")
    response_key: str = setting(F.RESPONSES, "column holding the list of N response strings of each prompt")
    data_source_key: str = setting(F.DATA_SOURCE, "column that selects the scoring function")
    reward_model_key: str = setting(F.REWARD_MODEL, "column holding a dict with ground_truth")
    extra_info_key: str = setting(F.EXTRA_INFO, "column passed to the scorer as extra_info (may be absent)")


@dataclass(frozen=True)
class EvalRewardConfig:
    """``reward_model``: how responses are scored (the scoring part of a reward manager)."""

    reward_manager: str = setting("naive", "reward manager whose score_items scores the responses: naive, prime, batch")
    timeout_s: float = setting(10.0, "seconds one scoring call may take before it scores 0", gt=0)
    executor: str = setting("process", "where scorer calls run: process, thread or inline (inline ignores timeout_s)")
    num_workers: int = setting(1, "parallel scoring processes / threads", ge=1)


@dataclass(frozen=True)
class EvalMetricsConfig:
    """``metrics``: the bootstrap behind the error bars."""

    n_bootstrap: int = setting(1000, "bootstrap resamples of the prompts", ge=1)
    seed: int = setting(42, "bootstrap seed (same seed, same error bars)")
    confidence: float = setting(0.95, "width of the reported percentile interval", gt=0, lt=1)


@dataclass(frozen=True)
class EvalConfig:
    """Root of the ``hybridflow eval`` config."""

    data: EvalDataConfig = section(EvalDataConfig, "input file and columns")
    reward_model: EvalRewardConfig = section(EvalRewardConfig, "scoring")
    custom_reward_function: CustomRewardFunctionConfig = section(CustomRewardFunctionConfig, "user scoring function")
    metrics: EvalMetricsConfig = section(EvalMetricsConfig, "bootstrap error bars")
    output_path: str | None = setting(None, "JSON report path; null = <input name>.eval.json next to the input")


def load_eval_config(config_files: list[str] | None, overrides: list[str]) -> EvalConfig:
    """Defaults ← YAML files ← ``key=value`` overrides, validated (raises :class:`ConfigError`)."""
    cfg = load_structured(EvalConfig, config_files, overrides)
    problems = check_leaves(cfg)
    if cfg.data.path is None:
        problems.append("data.path: required (the parquet or jsonl file with responses)")
    if cfg.reward_model.reward_manager not in REWARD_MANAGERS:
        problems.append(
            f"reward_model.reward_manager: unknown {cfg.reward_model.reward_manager!r}; "
            f"valid: {', '.join(REWARD_MANAGERS.names())}"
        )
    if cfg.reward_model.executor not in EXECUTORS:
        problems.append(
            f"reward_model.executor: unknown {cfg.reward_model.executor!r}; valid: {', '.join(EXECUTORS.names())}"
        )
    if problems:
        raise ConfigError(problems)
    return cfg


def report_path(cfg: EvalConfig) -> Path:
    """Where the JSON report goes: ``output_path`` or ``<input stem>.eval.json`` beside the input."""
    if cfg.output_path is not None:
        return Path(cfg.output_path)
    source = Path(str(cfg.data.path))
    return source.with_name(f"{source.stem}.eval.json")


# --- reading -------------------------------------------------------------------------------


@dataclass(frozen=True)
class EvalSample:
    """One response to score; ``prompt`` is the 0-based row it came from (its group)."""

    prompt: int
    data_source: str
    response: str
    ground_truth: Any
    extra_info: dict[str, Any] | None


def read_samples(path: str, data: EvalDataConfig) -> list[EvalSample]:
    """Every (row, response) pair of the file, row by row; bad rows raise :class:`DataRowError`."""
    rows = read_rows(path)
    samples: list[EvalSample] = []
    for i, row in enumerate(rows):
        samples += _row_samples(row, i, path, data)
    return samples


def _row_samples(row: dict[str, Any], i: int, path: str, data: EvalDataConfig) -> list[EvalSample]:
    for key in (data.response_key, data.data_source_key, data.reward_model_key):
        if key not in row:
            raise DataRowError(path, i, key, f"missing column (row has: {', '.join(sorted(row)) or 'nothing'})")
    source, reward_model, responses = row[data.data_source_key], row[data.reward_model_key], row[data.response_key]
    if not isinstance(source, str) or not source:
        raise DataRowError(path, i, data.data_source_key, f"expected a non-empty string, got {source!r}")
    if not isinstance(reward_model, dict) or GROUND_TRUTH not in reward_model:
        raise DataRowError(
            path, i, data.reward_model_key, f"expected a dict with {GROUND_TRUTH!r}, got {reward_model!r:.80}"
        )
    if isinstance(responses, str) or not isinstance(responses, (list, tuple)) or not responses:
        raise DataRowError(
            path, i, data.response_key, f"expected a non-empty list of response strings, got {responses!r:.80}"
        )
    bad = [j for j, r in enumerate(responses) if not isinstance(r, str)]
    if bad:
        raise DataRowError(
            path, i, data.response_key, f"response {bad[0]} is a {type(responses[bad[0]]).__name__}, not a string"
        )
    extra = row[data.extra_info_key] if data.extra_info_key in row else None
    if extra is not None and not isinstance(extra, dict):
        raise DataRowError(path, i, data.extra_info_key, f"expected a dict or null, got {type(extra).__name__}")
    return [EvalSample(i, source, text, reward_model[GROUND_TRUTH], extra) for text in responses]


# --- scoring -------------------------------------------------------------------------------


def build_scorer(cfg: EvalConfig) -> Callable[..., Any] | None:
    """The custom scoring function, or None for ``default_compute_score``. The file is imported
    where the scorer runs: in the scorer processes (executor ``process``), never in this one
    (see :class:`~hybridflow.reward.custom.CustomRewardFunction`)."""
    custom = cfg.custom_reward_function
    if not custom.path:
        return None
    return CustomRewardFunction(custom.path, custom.name, dict(custom.reward_kwargs))


def score_samples(
    samples: Sequence[EvalSample], reward: EvalRewardConfig, compute_score: Callable[..., Any] | None
) -> list[ScoreOutcome]:
    """One :class:`ScoreOutcome` per sample, computed by the reward manager's ``score_items``.

    With the default scorer an unknown data source is an error up front (instead of every
    item silently scoring 0).
    """
    if compute_score is None:
        check_known_sources((s.data_source for s in samples), ConfigError)
    manager = REWARD_MANAGERS.get(reward.reward_manager)(
        None,  # no tokenizer: the responses are already text
        compute_score=compute_score,
        timeout_s=None if reward.executor == "inline" else reward.timeout_s,
        executor=reward.executor,
        num_workers=reward.num_workers,
    )
    # response_length counts tokens in a rollout; offline there are none and score_items ignores it
    items = [ScoreItem(s.data_source, "", s.response, 0, s.ground_truth, s.extra_info) for s in samples]
    return manager.score_items(items)


# --- metrics -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Estimate:
    """A metric's value and its bootstrap spread."""

    value: float
    std: float
    ci_low: float
    ci_high: float


def bootstrap(
    per_prompt: dict[str, np.ndarray], n_bootstrap: int, rng: np.random.Generator, confidence: float
) -> dict[str, Estimate]:
    """Mean of each ``(P,)`` array and its bootstrap spread over prompts.

    All arrays are resampled with the same indices (paired resamples). With B resamples
    m_1..m_B of the mean: ``std`` = sample std of the m_b (0 for B = 1), interval = the
    ``(1 ± confidence) / 2`` quantiles of the m_b.
    """
    sizes = {len(v) for v in per_prompt.values()}
    if len(sizes) != 1 or 0 in sizes:
        raise ValueError(f"bootstrap needs non-empty arrays of one length, got lengths {sorted(sizes)}")
    (size,) = sizes
    resampled = {name: np.empty(n_bootstrap) for name in per_prompt}
    for b in range(n_bootstrap):
        idx = rng.integers(0, size, size=size)
        for name, values in per_prompt.items():
            resampled[name][b] = values[idx].mean()
    tail = (1.0 - confidence) / 2.0
    out = {}
    for name, values in per_prompt.items():
        boot = resampled[name]
        low, high = np.quantile(boot, [tail, 1.0 - tail])
        std = float(boot.std(ddof=1)) if n_bootstrap > 1 else 0.0
        out[name] = Estimate(float(values.mean()), std, float(low), float(high))
    return out


def source_rng(seed: int, data_source: str) -> np.random.Generator:
    """A generator per data source, so one source's error bars do not depend on the others."""
    return np.random.default_rng([seed, zlib.crc32(data_source.encode("utf-8"))])


def _per_prompt_arrays(stats: PromptStats) -> dict[str, np.ndarray]:
    arrays = {f"mean@{stats.n}": stats.mean}
    if stats.n > 1:
        arrays[f"best@{stats.n}"] = stats.best
        if stats.maj is not None:
            arrays[f"maj@{stats.n}"] = stats.maj
    return arrays


def summarize(
    samples: Sequence[EvalSample], outcomes: Sequence[ScoreOutcome], metrics: EvalMetricsConfig
) -> dict[str, Any]:
    """The report: per data source counts and estimates, plus the flat ``val-core/...`` metrics."""
    by_source: dict[str, list[int]] = {}
    for i, sample in enumerate(samples):
        by_source.setdefault(sample.data_source, []).append(i)
    sources: dict[str, Any] = {}
    flat: dict[str, float] = {}
    for source, idx in sorted(by_source.items()):
        prompts = [samples[i].prompt for i in idx]
        scores = [outcomes[i].score for i in idx]
        answers = [outcomes[i].extra.get(PRED) for i in idx]
        preds = answers if all(a is not None for a in answers) else None
        flat |= validation_metrics([source] * len(idx), prompts, scores, preds)
        stats = prompt_stats([source] * len(idx), prompts, scores, preds)[source]
        rng = source_rng(metrics.seed, source)
        estimates = bootstrap(_per_prompt_arrays(stats), metrics.n_bootstrap, rng, metrics.confidence)
        sources[source] = {
            "prompts": len(stats.mean),
            "responses": len(idx),
            "n": stats.n,
            "errors": sum(outcomes[i].status == ERROR for i in idx),
            "timeouts": sum(outcomes[i].status == TIMEOUT for i in idx),
            "metrics": {name: vars(est) for name, est in estimates.items()},
        }
    return {
        "n_bootstrap": metrics.n_bootstrap,
        "seed": metrics.seed,
        "confidence": metrics.confidence,
        "data_sources": sources,
        "metrics": flat,
    }


def format_table(report: dict[str, Any]) -> str:
    """The report as an aligned text table: one line per data source, ``value ± std`` cells."""
    header = ["data_source", "prompts", "N", "mean@N", "best@N", "maj@N", "errors", "timeouts"]
    lines = [header]
    for source, entry in report["data_sources"].items():
        cells = [source, str(entry["prompts"]), str(entry["n"])]
        for kind in ("mean", "best", "maj"):
            est = entry["metrics"].get(f"{kind}@{entry['n']}")
            cells.append("-" if est is None else f"{est['value']:.4f} ± {est['std']:.4f}")
        lines.append(cells + [str(entry["errors"]), str(entry["timeouts"])])
    widths = [max(len(row[c]) for row in lines) for c in range(len(header))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in lines)


# --- the whole evaluation ------------------------------------------------------------------


def evaluate(cfg: EvalConfig) -> dict[str, Any]:
    """Read, score and summarize ``cfg.data.path``; returns the report (nothing written)."""
    path = str(cfg.data.path)
    samples = read_samples(path, cfg.data)
    if not samples:
        raise DataFileError(f"{path}: no rows to evaluate")
    outcomes = score_samples(samples, cfg.reward_model, build_scorer(cfg))
    _log_first_fault(samples, outcomes)
    report = summarize(samples, outcomes, cfg.metrics)
    return {"input": path, **report}


def _log_first_fault(samples: Sequence[EvalSample], outcomes: Sequence[ScoreOutcome]) -> None:
    for sample, outcome in zip(samples, outcomes):
        if outcome.status != OK:
            logger.warning(
                "scoring %s (data_source=%s, row %d) scored 0: %s",
                outcome.status,
                sample.data_source,
                sample.prompt,
                outcome.message,
            )
            return


def write_report(report: dict[str, Any], path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    tmp.replace(path)
    return path
