"""Rollout engines: the ``BaseRollout`` interface, the ``ROLLOUTS`` registry and the built-in
torch sampler (``actor_rollout_ref.rollout.name=torch``).

The decode stack itself (sampler, decoders, KV cache, continuous batcher) lives in
:mod:`hybridflow.inference`; this package wraps it as a rollout worker.
"""

from hybridflow.workers.rollout.base import ROLLOUTS, BaseRollout, get_rollout_class
from hybridflow.workers.rollout.metrics import actor_logprob_diff
from hybridflow.workers.rollout.torch_rollout import TorchRollout
from hybridflow.workers.rollout.weight_sync import iter_weight_buckets

__all__ = [
    "ROLLOUTS",
    "BaseRollout",
    "TorchRollout",
    "actor_logprob_diff",
    "get_rollout_class",
    "iter_weight_buckets",
]
