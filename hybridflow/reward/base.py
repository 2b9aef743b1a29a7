"""What every reward manager does: decode responses, score them safely, place scores on tokens.

A reward manager is called on a batch after rollout (a ``DataProto`` with ``responses``, an
``attention_mask`` over prompt + response or a ``response_mask``, and the non-tensors
``data_source`` / ``reward_model`` / ``extra_info``) and returns

    (reward_tensor, reward_extra_info)

``reward_tensor`` is ``(B, T)`` float32, all zeros except the item's score at its last valid
response token (position ``len_i - 1``; position 0 for an empty response).
``reward_extra_info`` maps names to per-item lists (see ``outcomes.py``).

With a reward model the batch also holds ``rm_scores`` (same layout). As in verl they are the
reward and no rule runs; ``rule_reward="log"`` also runs the rule scorer and returns its score
as the ``rule_score`` column, ``"add"`` returns ``rm_scores`` + the rule's reward.

Subclasses change one of two hooks: :meth:`RewardManager.score_items` (how scores are
computed) or :meth:`RewardManager.adjust` (what is added to them afterwards).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch

from hybridflow import fields as F
from hybridflow.reward.custom import CustomRewardFunction
from hybridflow.reward.executors import OK, CallResult, ScorerPool, run_calls
from hybridflow.reward.outcomes import (
    REWARD_ERROR,
    REWARD_TIMEOUT,
    ScoreOutcome,
    collect_extra_info,
    to_outcome,
)
from hybridflow.reward.scorer_process import DEFAULT_MEMORY_LIMIT_MB, ScorerSettings
from hybridflow.reward.scorers import SCORERS, default_compute_score
from hybridflow.reward.scorers.code import CodeSandboxSpec
from hybridflow.utils.registry import Registry

logger = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 10.0  # = reward_model.timeout_s default
GROUND_TRUTH = "ground_truth"
RULE_SCORE = "rule_score"  # extra-info column: the rule scorer's reward beside a reward model's
RULE_REWARD_MODES = ("off", "log", "add")
REWARD_MANAGERS: Registry[type[RewardManager]] = Registry("reward manager")


@dataclass(frozen=True)
class ScoreItem:
    """One decoded response and what it is scored against."""

    data_source: str
    prompt_str: str
    response_str: str
    response_length: int
    ground_truth: Any
    extra_info: dict[str, Any] | None


def response_lengths(data: Any) -> torch.Tensor:
    """``(B,)`` long: index of the last valid response token + 1 (0 if none).

    Uses the response part of ``attention_mask`` if present, else ``response_mask``; taking
    the last 1 rather than the sum keeps multi-turn masks (0 on tool output) correct.
    """
    batch = data.batch
    width = batch[F.RESPONSES].shape[-1]
    if F.ATTENTION_MASK in batch.keys():
        mask = batch[F.ATTENTION_MASK][:, -width:]
    elif F.RESPONSE_MASK in batch.keys():
        mask = batch[F.RESPONSE_MASK]
    else:
        raise KeyError(f"reward manager needs {F.ATTENTION_MASK!r} or {F.RESPONSE_MASK!r} in the batch")
    positions = torch.arange(1, width + 1, device=mask.device).expand_as(mask)
    return (positions * (mask > 0)).max(dim=-1).values.long()


def _prompt_strings(data: Any, tokenizer: Any) -> list[str]:
    batch = data.batch
    if F.PROMPTS not in batch.keys():
        return [""] * len(batch[F.RESPONSES])
    prompts = batch[F.PROMPTS]
    width = prompts.shape[-1]
    if F.ATTENTION_MASK in batch.keys():
        lengths = batch[F.ATTENTION_MASK][:, :width].sum(-1).tolist()
        ids = [row[width - n :].tolist() for row, n in zip(prompts, lengths)]
    else:
        ids = prompts.tolist()
    return tokenizer.batch_decode(ids, skip_special_tokens=True)


def decode_items(data: Any, tokenizer: Any, reward_fn_key: str = F.DATA_SOURCE) -> list[ScoreItem]:
    """The batch as :class:`ScoreItem` s: valid response tokens decoded without special tokens."""
    responses = data.batch[F.RESPONSES]
    lengths = response_lengths(data).tolist()
    texts = tokenizer.batch_decode([row[:n].tolist() for row, n in zip(responses, lengths)], skip_special_tokens=True)
    prompts = _prompt_strings(data, tokenizer)
    non_tensor = data.non_tensor_batch
    for key in (reward_fn_key, F.REWARD_MODEL):
        if key not in non_tensor:
            raise KeyError(f"reward manager needs the non-tensor {key!r} in the batch (has: {sorted(non_tensor)})")
    extra_infos = non_tensor[F.EXTRA_INFO] if F.EXTRA_INFO in non_tensor else [None] * len(texts)
    items = []
    for i, (text, n) in enumerate(zip(texts, lengths)):
        reward_model = non_tensor[F.REWARD_MODEL][i]
        if not isinstance(reward_model, dict) or GROUND_TRUTH not in reward_model:
            raise ValueError(f"row {i}: {F.REWARD_MODEL} must be a dict with {GROUND_TRUTH!r}, got {reward_model!r}")
        items.append(
            ScoreItem(
                str(non_tensor[reward_fn_key][i]), prompts[i], text, n, reward_model[GROUND_TRUTH], extra_infos[i]
            )
        )
    return items


def finite_rm_scores(rm_scores: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``rm_scores`` as float32 with every row holding a NaN/inf zeroed, and that row mask ``(B,)``."""
    scores = rm_scores.float()
    bad = ~torch.isfinite(scores).all(dim=-1)
    return torch.where(bad[:, None], torch.zeros_like(scores), scores), bad


def place_scores(scores: torch.Tensor, lengths: torch.Tensor, width: int) -> torch.Tensor:
    """``(B, width)`` zeros with ``scores[i]`` at ``max(lengths[i] - 1, 0)``."""
    reward = torch.zeros(len(scores), width, dtype=torch.float32)
    positions = torch.clamp(lengths.long() - 1, min=0)
    reward[torch.arange(len(scores)), positions] = scores.to(torch.float32)
    return reward


class RewardManager:
    """Rule-based reward, one scorer call per item (the ``naive`` behaviour).

    Args:
        tokenizer: decodes responses (special tokens skipped).
        compute_score: ``fn(data_source, solution_str, ground_truth, extra_info)`` → float or
            dict with ``score``; default :func:`default_compute_score`. A
            :class:`CustomRewardFunction` is imported in the scorer processes (``process``
            executor), or here when the manager is made (``thread`` / ``inline``).
        num_examine: print this many decoded samples per data source on each call.
        reward_fn_key: non-tensor column naming each row's data source.
        timeout_s: per-call limit (``None``: none). A call past it scores 0 (``reward/timeouts``).
        executor: ``process`` | ``thread`` | ``inline`` (see ``executors.py``).
        num_workers: parallel scoring processes / threads.
        memory_limit_mb: address space each scorer process may add to what it started with
            (``RLIMIT_AS``; ``None`` or 0: no cap). ``process`` executor only.
    """

    default_compute_score: Callable[..., Any] = staticmethod(default_compute_score)

    def __init__(
        self,
        tokenizer: Any,
        *,
        compute_score: Callable[..., Any] | None = None,
        num_examine: int = 0,
        reward_fn_key: str = F.DATA_SOURCE,
        timeout_s: float | None = DEFAULT_TIMEOUT_S,
        executor: str = "process",
        num_workers: int = 1,
        memory_limit_mb: int | None = DEFAULT_MEMORY_LIMIT_MB,
        code_sandbox: CodeSandboxSpec | None = None,
        rule_reward: str = "off",
    ) -> None:
        if rule_reward not in RULE_REWARD_MODES:
            raise ValueError(f"rule_reward must be one of {', '.join(RULE_REWARD_MODES)}, got {rule_reward!r}")
        if memory_limit_mb is not None and memory_limit_mb < 0:
            raise ValueError(f"memory_limit_mb must be >= 0 (0: no cap), got {memory_limit_mb}")
        if executor != "process" and isinstance(compute_score, CustomRewardFunction):
            compute_score.load()  # no scorer processes: the file is imported here, errors now
        self.tokenizer = tokenizer
        self.uses_default_scorer = compute_score is None
        if compute_score is None:  # code_sandbox: where the default scorer runs code tests
            compute_score = (
                self.default_compute_score
                if code_sandbox is None
                else partial(self.default_compute_score, code_sandbox=code_sandbox)
            )
        self.compute_score = compute_score
        self.num_examine = num_examine
        self.reward_fn_key = reward_fn_key
        self.timeout_s = timeout_s
        self.executor = executor
        self.num_workers = num_workers
        self.memory_limit_mb = memory_limit_mb
        self.rule_reward = rule_reward
        self._faults_logged: set[str] = set()
        # Scoring processes forked now, while the trainer is small (before the models load),
        # and kept: see ScorerPool.
        self._pool = self._make_pool()

    def _make_pool(self) -> ScorerPool | None:
        if self.executor != "process":
            return None
        return ScorerPool(
            self.compute_score,
            self.num_workers,
            load_timeout_s=self.timeout_s,
            settings=ScorerSettings(memory_limit_mb=self.memory_limit_mb),
        )

    @property
    def isolation(self) -> str | None:
        """How the scorer processes are kept from the trainer: ``"pid-namespace"``, ``"session"``
        (the weaker fallback, logged as a warning), or None without processes."""
        return self._pool.isolation if self._pool is not None else None

    def scorer_pids(self) -> list[int]:
        """Process ids of the kept scorer processes (empty for ``thread`` / ``inline``)."""
        return self._pool.pids if self._pool is not None else []

    def close(self) -> None:
        """Stop the scoring processes (also done when the manager is garbage-collected)."""
        if self._pool is not None:
            self._pool.close()

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_pool": None}  # processes do not travel; a copy forks its own

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._pool = self._make_pool()

    def __call__(self, data: Any) -> tuple[torch.Tensor, dict[str, list[Any]]]:
        if F.RM_SCORES not in data.batch.keys():
            return self.rule_reward_of(data)
        rm_scores, bad = finite_rm_scores(data.batch[F.RM_SCORES])
        if bad.any():
            logger.warning(
                "the reward model scored %d of %d responses NaN or infinite; they score 0 (counted in reward/errors)",
                int(bad.sum()),
                len(bad),
            )
        if self.rule_reward == "off":
            return rm_scores, {REWARD_ERROR: bad.float().tolist(), REWARD_TIMEOUT: [0.0] * len(bad)}
        reward, info = self.rule_reward_of(data)
        info.pop("score", None)  # the rule's own "score" column would pass for the reward: it is rule_score here
        info[RULE_SCORE] = reward.sum(-1).tolist()
        info[REWARD_ERROR] = [max(a, b) for a, b in zip(info[REWARD_ERROR], bad.float().tolist())]
        return (rm_scores + reward if self.rule_reward == "add" else rm_scores), info

    def rule_reward_of(self, data: Any) -> tuple[torch.Tensor, dict[str, list[Any]]]:
        """The rule scorer's ``(reward_tensor, reward_extra_info)`` (what the manager returns without a reward model)."""
        items = decode_items(data, self.tokenizer, self.reward_fn_key)
        if self.uses_default_scorer:
            check_known_sources(item.data_source for item in items)
        outcomes = self.score_items(items)
        self._log_first_faults(items, outcomes)
        scores, extra = self.adjust(items, outcomes)
        lengths = torch.tensor([item.response_length for item in items], dtype=torch.long)
        reward = place_scores(torch.tensor(scores, dtype=torch.float32), lengths, data.batch[F.RESPONSES].shape[-1])
        info = {**collect_extra_info(outcomes), **extra}
        self._examine(items, scores)
        return reward, info

    def score_items(self, items: list[ScoreItem]) -> list[ScoreOutcome]:
        """One ``compute_score`` call per item, contained by the executor."""
        calls = [
            {
                "data_source": it.data_source,
                "solution_str": it.response_str,
                "ground_truth": it.ground_truth,
                "extra_info": it.extra_info,
            }
            for it in items
        ]
        return [to_outcome(result) for result in self.run_scorer(calls)]

    def run_scorer(self, calls: list[dict[str, Any]], timeout_s: float | None = None) -> list[CallResult]:
        """``compute_score(**call)`` for each call, contained by the executor (the kept
        processes for ``process``); each call may take ``timeout_s`` (default: the manager's)."""
        timeout_s = self.timeout_s if timeout_s is None else timeout_s
        if self._pool is not None:
            return self._pool.run(calls, timeout_s) if calls else []
        return run_calls(
            self.compute_score, calls, executor=self.executor, timeout_s=timeout_s, num_workers=self.num_workers
        )

    def adjust(self, items: list[ScoreItem], outcomes: list[ScoreOutcome]) -> tuple[list[float], dict[str, list[Any]]]:
        """Final per-item rewards and extra-info columns to add; here the scores unchanged."""
        return [o.score for o in outcomes], {}

    def _log_first_faults(self, items: list[ScoreItem], outcomes: list[ScoreOutcome]) -> None:
        for item, outcome in zip(items, outcomes):
            if outcome.status == OK or outcome.status in self._faults_logged:
                continue
            self._faults_logged.add(outcome.status)
            logger.warning(
                "reward scoring %s (data_source=%s), item scored 0: %s. Further %ss are counted in "
                "reward/errors / reward/timeouts but not logged again.",
                outcome.status,
                item.data_source,
                outcome.message,
                outcome.status,
            )

    def _examine(self, items: list[ScoreItem], scores: list[float]) -> None:
        shown: dict[str, int] = {}
        for item, score in zip(items, scores):
            if shown.setdefault(item.data_source, 0) >= self.num_examine:
                continue
            shown[item.data_source] += 1
            print(
                f"[prompt] {item.prompt_str}\n[response] {item.response_str}\n"
                f"[ground_truth] {item.ground_truth}\n[score] {score}"
            )


def check_known_sources(data_sources: Iterable[str], error: type[Exception] = ValueError) -> None:
    """Raise ``error`` naming every data source that has no built-in scorer (checked where the
    default scorer is used, so an unknown source fails up front instead of scoring 0)."""
    unknown = sorted({source for source in data_sources if source not in SCORERS})
    if unknown:
        raise error(
            f"no built-in scorer for data_source {', '.join(map(repr, unknown))}; known: {', '.join(SCORERS.names())}. "
            "Set custom_reward_function.path to a file with compute_score(data_source, solution_str, "
            "ground_truth, extra_info=None)."
        )


__all__ = [
    "DEFAULT_TIMEOUT_S",
    "REWARD_MANAGERS",
    "RULE_SCORE",
    "RewardManager",
    "ScoreItem",
    "decode_items",
    "place_scores",
    "response_lengths",
]
