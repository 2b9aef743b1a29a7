"""The rollout interface's declared capabilities: flags instead of attribute probes, a clear
error for an undeclared one, and a rollout worker that works with none of them."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from hybridflow import fields as F
from hybridflow.config import load_config
from hybridflow.protocol import DataProto
from hybridflow.workers.rollout import (
    ROLLOUTS,
    AgentLoopRollout,
    BaseRollout,
    RolloutCapabilities,
    RolloutCapabilityError,
    RolloutOutput,
    TorchRollout,
)
from hybridflow.workers.rollout.server_rollout import ServerRollout
from hybridflow.workers.rollout.worker import RolloutWorker

PLAIN = "capability-tests-plain"


@ROLLOUTS.register(PLAIN)
class PlainRollout(BaseRollout):
    """Generates (the prompt ids echoed as the response) and takes weights; declares nothing else."""

    def __init__(self, config: Any, model: Any, tokenizer: Any = None, *, dtype: Any = None) -> None:
        self.model = model
        self.loaded: list[str] = []

    def generate_sequences(self, prompts: DataProto) -> DataProto:
        ids = prompts.batch[F.INPUT_IDS]
        return DataProto.from_dict(
            tensors={F.PROMPTS: ids, F.RESPONSES: ids, F.RESPONSE_MASK: prompts.batch[F.ATTENTION_MASK]},
            meta_info=dict(prompts.meta_info),
        )

    def update_weights(self, weights: Any) -> None:
        self.loaded += [name for name, _ in weights]


def test_the_built_in_rollouts_declare_what_they_can_do() -> None:
    assert BaseRollout.capabilities == RolloutCapabilities()
    assert TorchRollout.capabilities == RolloutCapabilities(sleep_wake=True)
    assert AgentLoopRollout.capabilities == RolloutCapabilities(
        partial_rollout=True, sleep_wake=True, weight_version=True, swap_lock=True
    )
    assert ServerRollout.capabilities == RolloutCapabilities()


@pytest.mark.parametrize(
    ("call", "capability"),
    [
        (lambda r: r.set_partial_rollout(True), "partial_rollout"),
        (lambda r: r.abort_generation(), "partial_rollout"),
        (lambda r: r.resume_generation(), "partial_rollout"),
        (lambda r: r.set_weight_version(3), "weight_version"),
        (lambda r: r.swap_lock, "swap_lock"),
        (lambda r: r.release(), "sleep_wake"),
        (lambda r: r.resume(), "sleep_wake"),
    ],
)
def test_an_undeclared_capability_is_an_error_naming_the_rollout_and_the_capability(call, capability) -> None:
    rollout = PlainRollout(None, None)
    expected = rf"PlainRollout does not support .*RolloutCapabilities\.{capability}"
    with pytest.raises(RolloutCapabilityError, match=expected) as err:
        call(rollout)
    assert err.value.capability == capability


def test_the_defaults_that_need_no_capability() -> None:
    rollout = PlainRollout(None, None)
    rollout.set_partial_rollout(False)  # turning partial rollout off is always allowed
    rollout.weights_changed()  # nothing derived from the weights: nothing to drop
    prompts = DataProto.from_dict(tensors={F.INPUT_IDS: torch.ones(2, 3, dtype=torch.long),
                                           F.ATTENTION_MASK: torch.ones(2, 3, dtype=torch.long)})
    data, metrics = rollout.generate_with_metrics(prompts)
    assert metrics == {} and torch.equal(data.batch[F.RESPONSES], prompts.batch[F.INPUT_IDS])


def test_a_rollout_worker_runs_a_rollout_with_no_capabilities(tiny_model_dir) -> None:
    config = load_config(None, [f"actor_rollout_ref.model.path={tiny_model_dir}",
                                f"actor_rollout_ref.rollout.name={PLAIN}",
                                "actor_rollout_ref.rollout.response_length=4",
                                "actor_rollout_ref.rollout.checkpoint_engine.backend=inproc"])
    assert config.actor_rollout_ref.rollout.free_cache_engine  # the worker must not call release()
    worker = RolloutWorker(config.actor_rollout_ref, share_name=None)
    worker.init_model()
    prompts = DataProto.from_dict(tensors={F.INPUT_IDS: torch.ones(2, 3, dtype=torch.long),
                                           F.ATTENTION_MASK: torch.ones(2, 3, dtype=torch.long)})
    out = worker.generate_sequences(prompts)
    assert isinstance(out, RolloutOutput) and out.metrics == {}
    assert out.data.meta_info[F.META_WEIGHT_VERSION] == 0
    # a sync needs neither a swap lock nor a weight-version stamp on the rollout
    pairs = [(name, tensor.clone()) for name, tensor in worker.rollout.model.state_dict().items()][:2]
    assert worker.update_weights(pairs, version=3)["weight_sync/version"] == 3
    assert worker.generate_sequences(prompts).data.meta_info[F.META_WEIGHT_VERSION] == 3
    worker.set_partial_rollout(False)
    with pytest.raises(RolloutCapabilityError, match="PlainRollout does not support partial rollout"):
        worker.set_partial_rollout(True)
    with pytest.raises(RolloutCapabilityError, match="abort_generation"):
        worker.abort_generation()
