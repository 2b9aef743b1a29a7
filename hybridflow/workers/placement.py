"""The default placement: actor + rollout + reference colocated in one process per rank.

    spec = colocated_actor_rollout_ref(cfg.actor_rollout_ref, rollout=ClassWithInitArgs(RolloutWorker, ...),
                                       with_ref=True, total_training_steps=N)
    group = create_worker_group(cfg.trainer.backend, ResourcePool([1]), spec)
    roles = group.spawn()              # {"actor": ..., "rollout": ..., "ref": ...}
    roles["actor"].init_model()        # first: it publishes the live policy
    roles["rollout"].init_model(); roles["ref"].init_model()

All roles get the same ``share_name``, so the rollout and a LoRA reference use the actor's
module (see :mod:`hybridflow.workers.shared_policy`). The rollout worker class is passed in
(it belongs to :mod:`hybridflow.workers.rollout`), with its own init arguments.
"""

from __future__ import annotations

from typing import Any

from hybridflow.config import ActorRolloutRefConfig
from hybridflow.config.distillation import DistillationConfig
from hybridflow.controller import ClassWithInitArgs, ColocatedWorker, colocated_class
from hybridflow.workers.actor import ActorWorker
from hybridflow.workers.reference import ReferenceWorker
from hybridflow.workers.shared_policy import DEFAULT_SHARE_NAME

ACTOR_ROLE = "actor"
ROLLOUT_ROLE = "rollout"
REF_ROLE = "ref"


def actor_rollout_ref_roles(
    config: ActorRolloutRefConfig,
    *,
    rollout: ClassWithInitArgs[Any] | None,
    with_ref: bool,
    total_training_steps: int | None = None,
    device: str = "cpu",
    seed: int = 0,
    share_name: str = DEFAULT_SHARE_NAME,
    distillation: DistillationConfig | None = None,
) -> dict[str, ClassWithInitArgs[Any]]:
    """``{role: ClassWithInitArgs}`` in build order: actor, then rollout (if given), then ref.
    ``distillation``: the run's section, for the actor's distillation term."""
    roles: dict[str, ClassWithInitArgs[Any]] = {
        ACTOR_ROLE: ClassWithInitArgs(
            ActorWorker,
            config,
            total_training_steps=total_training_steps,
            device=device,
            seed=seed,
            share_name=share_name,
            distillation=distillation,
        )
    }
    if rollout is not None:
        roles[ROLLOUT_ROLE] = rollout
    if with_ref:
        roles[REF_ROLE] = ClassWithInitArgs(ReferenceWorker, config, device=device, share_name=share_name)
    return roles


def colocated_actor_rollout_ref(
    config: ActorRolloutRefConfig,
    *,
    rollout: ClassWithInitArgs[Any] | None,
    with_ref: bool,
    total_training_steps: int | None = None,
    device: str = "cpu",
    seed: int = 0,
    share_name: str = DEFAULT_SHARE_NAME,
) -> ClassWithInitArgs[ColocatedWorker]:
    """The colocated worker spec for a worker group (call ``spawn()`` on the group)."""
    roles = actor_rollout_ref_roles(
        config,
        rollout=rollout,
        with_ref=with_ref,
        total_training_steps=total_training_steps,
        device=device,
        seed=seed,
        share_name=share_name,
    )
    return colocated_class(roles)
