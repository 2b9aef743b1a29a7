"""Rollout engines: the ``BaseRollout`` interface, the ``ROLLOUTS`` registry and the built-in
torch sampler (``actor_rollout_ref.rollout.name=torch``) and its agent-loop form
(``agent_loop``, used for ``torch`` by the rollout worker: see :mod:`.agent_loop`).

The decode stack itself (sampler, decoders, KV cache, continuous batcher) lives in
:mod:`hybridflow.inference`; this package wraps it as a rollout worker.
"""

from hybridflow.inference.weight_transfer import iter_weight_buckets
from hybridflow.workers.rollout.agent_loop import AgentLoopRollout
from hybridflow.workers.rollout.base import (
    ROLLOUTS,
    BaseRollout,
    RolloutCapabilities,
    RolloutCapabilityError,
    RolloutOutput,
    get_rollout_class,
)
from hybridflow.workers.rollout.metrics import actor_logprob_diff
from hybridflow.workers.rollout.torch_rollout import TorchRollout

__all__ = [
    "AgentLoopRollout",
    "ROLLOUTS",
    "BaseRollout",
    "RolloutCapabilities",
    "RolloutCapabilityError",
    "RolloutOutput",
    "TorchRollout",
    "actor_logprob_diff",
    "get_rollout_class",
    "iter_weight_buckets",
]
