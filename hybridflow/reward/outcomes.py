"""From raw scorer results to scores: validation, per-item extra info and fault metrics.

A scorer may return a real number or a dict with a real ``"score"``. Anything else (another
type, a missing ``score``, NaN or ±inf — also after the cast to float32, the reward tensor's
dtype, so ±1e300 counts as inf — or an integer too large for a float at all, like
``10**400``) is an error for that item, like an exception: the item scores 0 and is counted.
So is a dict whose other entries hold such an integer: the trainer turns those entries into
floats for its metrics, where it would raise ``OverflowError``. Per-item flags ``reward_error`` / ``reward_timeout`` (1.0 or 0.0) go
into the extra info of every batch; :func:`reward_fault_metrics` sums them into the step
metrics ``reward/errors`` and ``reward/timeouts``.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field
from typing import Any

from hybridflow.reward.executors import ERROR, OK, TIMEOUT, CallResult
from hybridflow.utils.errors import short_repr

SCORE = "score"
# Largest float32: anything of greater magnitude rounds to ±inf in the reward tensor (values
# a hair above it that would round down to it are treated as overflow too).
FLOAT32_MAX = 3.4028234663852886e38
REWARD_ERROR = "reward_error"
REWARD_TIMEOUT = "reward_timeout"


class ScoreTypeError(TypeError):
    """A scorer returned something that is not a finite number or a dict with one under ``score``."""


@dataclass(frozen=True)
class ScoreOutcome:
    """One item's scoring result: ``score`` is 0.0 unless ``status == "ok"``."""

    score: float
    status: str
    extra: dict[str, Any] = field(default_factory=dict)
    message: str = ""


def _as_float(value: numbers.Real, what: str) -> float:
    try:
        return float(value)
    except OverflowError:  # an int (or Fraction) beyond the float range: 10**400
        raise ScoreTypeError(f"{what} is {_describe_large(value)}, too large to be a float") from None


def _describe_large(value: numbers.Real) -> str:
    """Words for a number too large for a float; its repr may be too long to print (or even to
    make: Python refuses to turn an int of over 4300 digits into text)."""
    if isinstance(value, int):
        return f"an integer of about {int(value.bit_length() * math.log10(2)) + 1} digits"
    return f"a {type(value).__name__} beyond the float range"


def _check_extra(key: Any, value: Any) -> None:
    """Refuse a number in a dict result's other entries that cannot become a float."""
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        _as_float(value, f"the {key!r} entry")


def _finite(value: Any, what: str) -> float:
    if not isinstance(value, numbers.Real):
        raise ScoreTypeError(f"{what} must be a real number, got {type(value).__name__}: {short_repr(value)}")
    result = _as_float(value, what)
    if not math.isfinite(result):
        raise ScoreTypeError(f"{what} is {result}, not a finite number")
    if abs(result) > FLOAT32_MAX:
        raise ScoreTypeError(f"{what} is {result:g}, which is ±inf as float32 (the reward tensor's dtype)")
    return result


def normalize_result(value: Any) -> tuple[float, dict[str, Any]]:
    """``(score, extra)`` from a scorer's return value; raises :class:`ScoreTypeError` if invalid.

    ``extra`` holds every key of a dict result (``score`` included, as a float), else ``{}``.
    """
    if isinstance(value, dict):
        if SCORE not in value:
            raise ScoreTypeError(f"scorer returned a dict without 'score' (keys: {sorted(value)})")
        score = _finite(value[SCORE], "the 'score' entry")
        for key, extra in value.items():
            if key != SCORE:
                _check_extra(key, extra)
        return score, {**value, SCORE: score}
    return _finite(value, "the score"), {}


def to_outcome(result: CallResult) -> ScoreOutcome:
    """Validate one :class:`CallResult` into a :class:`ScoreOutcome`."""
    if result.status != OK:
        return ScoreOutcome(0.0, result.status, message=result.message)
    try:
        score, extra = normalize_result(result.value)
    except ScoreTypeError as exc:
        return ScoreOutcome(0.0, ERROR, message=str(exc))
    return ScoreOutcome(score, OK, extra)


def collect_extra_info(outcomes: list[ScoreOutcome]) -> dict[str, list[Any]]:
    """Per-item lists: every key any dict result had (``None`` where an item lacks it) plus fault flags."""
    keys: dict[str, None] = {}
    for outcome in outcomes:
        keys.update(dict.fromkeys(outcome.extra))
    info: dict[str, list[Any]] = {key: [o.extra.get(key) for o in outcomes] for key in keys}
    info[REWARD_ERROR] = [1.0 if o.status == ERROR else 0.0 for o in outcomes]
    info[REWARD_TIMEOUT] = [1.0 if o.status == TIMEOUT else 0.0 for o in outcomes]
    return info


def scored_extra_floats(extra_info: Any, key: str, what: str) -> list[float]:
    """Per-item floats of the scorer's ``key`` entry (a multi-reward component, a filter metric).

    An item whose scoring failed (error or timeout) has no entries: it counts 0.0, as its score
    does. An item that scored but lacks the entry, or holds a non-number there, is refused with
    a message naming ``what``."""
    values = list(extra_info[key])
    errors = list(extra_info.get(REWARD_ERROR, [0.0] * len(values)))
    timeouts = list(extra_info.get(REWARD_TIMEOUT, [0.0] * len(values)))
    out = []
    for i, value in enumerate(values):
        if value is None and (float(errors[i]) > 0 or float(timeouts[i]) > 0):
            out.append(0.0)
        elif isinstance(value, numbers.Real):
            out.append(float(value))  # scoring refused entries too large for a float
        else:
            raise ValueError(f"{what}: the scorer's {key!r} of item {i} is {short_repr(value)}, not a number")
    return out


def reward_fault_metrics(reward_extra_info: dict[str, list[Any]]) -> dict[str, float]:
    """``{"reward/errors": n, "reward/timeouts": m}`` for one step's reward extra info."""
    return {
        "reward/errors": float(sum(reward_extra_info[REWARD_ERROR])),
        "reward/timeouts": float(sum(reward_extra_info[REWARD_TIMEOUT])),
    }
