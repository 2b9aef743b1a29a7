"""Weight sync: moving the actor's weights to the rollout engine after every update.

verl calls this the checkpoint engine (``actor_rollout_ref.rollout.checkpoint_engine``).
A :class:`~hybridflow.weight_sync.base.WeightSync` takes the actor's ``(name, tensor)`` pairs
(:meth:`~hybridflow.engine.base.TrainEngine.iter_sync_weights`: LoRA merged, tied weights
once, FSDP shards gathered) and a version (the global step), and delivers them to a
:mod:`target <hybridflow.weight_sync.targets>`:

========  ================================================================================
shared    the rollout samples from the actor's own module: nothing moves, the version is stamped
inproc    bucketed copies into another module or engine in this process (staged, then swapped)
http      safetensors buckets posted to a ``hybridflow serve --control-routes`` process
disk      safetensors files in a folder, loaded by the target (a module, an engine, a server)
========  ================================================================================

Every backend is atomic from a reader's view (the target swaps all tensors at once, between
two forwards) and leaves the old weights serving when a transfer fails.
"""

from hybridflow.weight_sync.base import WEIGHT_SYNCS, SyncReport, WeightSync, build_weight_sync
from hybridflow.weight_sync.targets import EngineTarget, ModuleTarget, WeightTarget

# Importing the backends registers them.
from hybridflow.weight_sync import disk, http, inproc, shared  # noqa: E402, F401  isort: skip

__all__ = [
    "WEIGHT_SYNCS",
    "EngineTarget",
    "ModuleTarget",
    "SyncReport",
    "WeightSync",
    "WeightTarget",
    "build_weight_sync",
]
