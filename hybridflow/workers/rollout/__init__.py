"""Rollout engines: the ``BaseRollout`` interface, the ``ROLLOUTS`` registry and the built-in
torch sampler (``actor_rollout_ref.rollout.name=torch``)."""

from hybridflow.workers.rollout.base import ROLLOUTS, BaseRollout, get_rollout_class
from hybridflow.workers.rollout.generation import Generated, generate
from hybridflow.workers.rollout.metrics import actor_logprob_diff
from hybridflow.workers.rollout.sampling import SamplingParams, sample_next, token_log_probs
from hybridflow.workers.rollout.torch_rollout import TorchRollout, build_decoder
from hybridflow.workers.rollout.weight_sync import iter_weight_buckets, load_named_tensors

__all__ = [
    "ROLLOUTS",
    "BaseRollout",
    "Generated",
    "SamplingParams",
    "TorchRollout",
    "actor_logprob_diff",
    "build_decoder",
    "generate",
    "get_rollout_class",
    "iter_weight_buckets",
    "load_named_tensors",
    "sample_next",
    "token_log_probs",
]
