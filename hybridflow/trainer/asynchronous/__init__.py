"""Asynchronous training: generation and training overlap (``async_training.mode``).

* :mod:`.schedule` — who may generate what, when: the chunk/update/sync sizes of a mode and
  the staleness bound (pure, no threads);
* :mod:`.queue` — the bounded queue of scored chunks between the two threads;
* :mod:`.rollouter` — the thread that generates and scores chunks ahead of the trainer;
* :mod:`.trainer` — :class:`AsyncPPOTrainer`, the PPO trainer's phases driven from the queue,
  with weight syncs every ``trigger_parameter_sync_step`` updates.

See docs/async.md.
"""

from hybridflow.trainer.asynchronous.schedule import AsyncSchedule, VersionGate
from hybridflow.trainer.asynchronous.trainer import AsyncPPOTrainer

__all__ = ["AsyncPPOTrainer", "AsyncSchedule", "VersionGate"]
