"""Learning-rate schedules with linear warm-up (``optim.lr_scheduler_type``).

Each schedule maps the scheduler step s to a factor of the base learning rate:

* warm-up (both): f(s) = s / max(1, W) for s < W, W = warm-up steps;
* ``constant``: f(s) = 1 after warm-up;
* ``cosine``: with p = (s − W) / max(1, S − W) (S = total steps),
  f(s) = max(r, r + (1 − r)·½·(1 + cos(2π·c·p))), r = ``min_lr_ratio``, c = ``num_cycles``
  (0.5 → one half-period from 1 down to r).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import partial

from hybridflow.utils.registry import Registry

LrLambda = Callable[[int], float]
# name -> builder(warmup_steps, total_steps, min_lr_ratio, num_cycles) -> LrLambda
LR_SCHEDULES: Registry[Callable[..., LrLambda]] = Registry("lr scheduler type")


def resolve_warmup_steps(warmup_steps: int, warmup_ratio: float, total_steps: int | None) -> int:
    """Warm-up steps: ``warmup_steps`` if > 0, else ``int(warmup_ratio · total_steps)``."""
    if warmup_steps > 0:
        return warmup_steps
    if not 0.0 <= warmup_ratio <= 1.0:
        raise ValueError(f"lr warm-up ratio must be in [0, 1], got {warmup_ratio}")
    if warmup_ratio > 0.0 and total_steps is None:
        raise ValueError("a lr warm-up ratio needs the total number of training steps")
    return int(warmup_ratio * (total_steps or 0))


def _warmup(step: int, warmup_steps: int) -> float:
    return step / max(1, warmup_steps)


def _constant(step: int, warmup_steps: int) -> float:
    return _warmup(step, warmup_steps) if step < warmup_steps else 1.0


def _cosine(step: int, warmup_steps: int, total_steps: int, min_lr_ratio: float, num_cycles: float) -> float:
    if step < warmup_steps:
        return _warmup(step, warmup_steps)
    progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
    factor = min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + math.cos(2.0 * math.pi * num_cycles * progress))
    return max(min_lr_ratio, factor)


@LR_SCHEDULES.register("constant")
def constant_schedule(warmup_steps: int, total_steps: int | None, min_lr_ratio: float, num_cycles: float) -> LrLambda:
    return partial(_constant, warmup_steps=warmup_steps)


@LR_SCHEDULES.register("cosine")
def cosine_schedule(warmup_steps: int, total_steps: int | None, min_lr_ratio: float, num_cycles: float) -> LrLambda:
    if total_steps is None or total_steps < 1:
        raise ValueError(f"the cosine lr schedule needs total training steps >= 1, got {total_steps}")
    if not 0.0 <= min_lr_ratio <= 1.0:
        raise ValueError(f"min_lr_ratio must be in [0, 1], got {min_lr_ratio}")
    return partial(
        _cosine, warmup_steps=warmup_steps, total_steps=total_steps, min_lr_ratio=min_lr_ratio, num_cycles=num_cycles
    )


def build_lr_lambda(
    scheduler_type: str,
    warmup_steps: int,
    total_steps: int | None,
    min_lr_ratio: float = 0.0,
    num_cycles: float = 0.5,
) -> LrLambda:
    """The factor function of schedule ``scheduler_type`` (unknown name → error listing names)."""
    return LR_SCHEDULES.get(scheduler_type)(warmup_steps, total_steps, min_lr_ratio, num_cycles)
