"""Colocated actor + rollout + reference in one process through the in-process worker group."""

from __future__ import annotations

import torch

from hybridflow import fields as FK
from hybridflow.controller import (
    ClassWithInitArgs,
    Dispatch,
    LocalWorkerGroup,
    ResourcePool,
    Worker,
    register,
)
from hybridflow.workers.placement import colocated_actor_rollout_ref
from hybridflow.workers.shared_policy import lookup_policy, withdraw_policy


class ProbeRollout(Worker):
    """Stands in for the rollout role: reports whether it sees the actor's live module."""

    def __init__(self, share_name: str) -> None:
        super().__init__()
        self.share_name = share_name
        self.module: torch.nn.Module | None = None

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self) -> None:
        self.module = lookup_policy(self.share_name, self.rank).module

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def weight_sum(self) -> float:
        return float(sum(p.detach().double().sum() for p in self.module.parameters()))


def test_colocated_roles_share_the_actor_module(make_config, make_rollout_batch) -> None:
    cfg = make_config("actor_rollout_ref.model.lora_rank=4", "actor_rollout_ref.actor.optim.lr=1e-2")
    spec = colocated_actor_rollout_ref(
        cfg.actor_rollout_ref, rollout=ClassWithInitArgs(ProbeRollout, share_name="placement-test"),
        with_ref=True, share_name="placement-test",
    )
    group = LocalWorkerGroup(ResourcePool([1]), spec)
    roles = group.spawn()
    assert list(roles) == ["actor", "rollout", "ref"]
    try:
        roles["actor"].init_model()
        roles["rollout"].init_model()
        roles["ref"].init_model()
        data = make_rollout_batch(seed=0)
        ref = roles["ref"].compute_ref_log_prob(data).batch[FK.REF_LOG_PROB]
        old = roles["actor"].compute_log_prob(data).batch[FK.OLD_LOG_PROBS]
        torch.testing.assert_close(ref, old, rtol=0, atol=1e-6)  # LoRA B = 0: actor == base at start
        [before] = roles["rollout"].weight_sum()
        metrics = roles["actor"].update_actor(data)
        assert metrics["actor/lr"] == [1e-2]  # one value per rank
        [after] = roles["rollout"].weight_sum()
        assert after != before  # the rollout sees the update at once: same module, no copy
    finally:
        withdraw_policy("placement-test", 0)
