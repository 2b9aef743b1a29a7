"""When producers run relative to the consumer phases (``async_training.mode``).

* :mod:`.sync` — produce one batch, consume it, sync the weights (the default);
* :mod:`.background` — ``one_step_off`` / ``fully_async``: a rollouter thread
  (:mod:`.rollouter`) produces ahead of the trainer within the staleness bound
  (:mod:`.plan`), through the same replay buffer.

A schedule provides ``start``, ``stop``, ``next_batch``, ``after_update``, ``step_metrics``,
``sync_rollout_weights``, ``controller_state`` and ``exclusive`` (the lock validation and
checkpoints hold). See docs/async.md.
"""

from __future__ import annotations

from hybridflow.trainer.schedules.background import BackgroundSchedule
from hybridflow.trainer.schedules.base import TrainerState
from hybridflow.trainer.schedules.sync import SyncSchedule

Schedule = SyncSchedule | BackgroundSchedule
SCHEDULES: dict[str, type[SyncSchedule] | type[BackgroundSchedule]] = {
    "sync": SyncSchedule,
    "one_step_off": BackgroundSchedule,
    "fully_async": BackgroundSchedule,
}


def make_schedule(trainer: TrainerState) -> Schedule:
    mode = trainer.config.async_training.mode
    if mode not in SCHEDULES:
        raise ValueError(f"async_training.mode={mode!r} is unknown; choose one of {sorted(SCHEDULES)}")
    return SCHEDULES[mode](trainer)


__all__ = ["SCHEDULES", "BackgroundSchedule", "Schedule", "SyncSchedule", "make_schedule"]
