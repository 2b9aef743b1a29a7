"""Colocation: several roles' workers in one process per rank.

A :class:`ColocatedWorker` is what the group places on each rank; it builds one object per
role (e.g. ``{"actor": ActorWorker, "critic": CriticWorker}``) under the same rank, so the
roles share the process, its memory and its devices. Calls reach a role object by its role
name; ``WorkerGroup.spawn()`` gives the controller one group per role, each exposing only
that role's ``@register`` methods. Colocation is a placement decision: the role classes stay
separate, one class per role.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hybridflow.controller.resource_pool import ClassWithInitArgs
from hybridflow.controller.worker import Worker

__all__ = ["ColocatedWorker", "colocated_class", "colocated_role_classes"]


class ColocatedWorker(Worker):
    """Holds ``{role: worker}`` built from ``{role: ClassWithInitArgs}``, in role order."""

    def __init__(self, roles: Mapping[str, ClassWithInitArgs[Any]]) -> None:
        super().__init__()
        _check_roles(roles)
        # Built inside the group's rank context, so every role learns the same rank.
        self.roles: dict[str, Worker] = {name: spec.build() for name, spec in roles.items()}

    def role(self, name: str) -> Worker:
        """The worker object of role ``name``."""
        if name not in self.roles:
            raise ValueError(f"unknown role {name!r}; this process hosts {sorted(self.roles)}")
        return self.roles[name]


def _check_roles(roles: Mapping[str, ClassWithInitArgs[Any]]) -> None:
    if not isinstance(roles, Mapping) or not roles:
        raise ValueError("ColocatedWorker needs a non-empty {role: ClassWithInitArgs} mapping")
    for name, spec in roles.items():
        if not isinstance(name, str) or not name:
            raise ValueError(f"role names must be non-empty strings, got {name!r}")
        if not isinstance(spec, ClassWithInitArgs):
            raise TypeError(f"role {name!r}: expected ClassWithInitArgs, got {type(spec).__name__}")
        if not issubclass(spec.cls, Worker):
            raise TypeError(f"role {name!r}: {spec.cls.__qualname__} is not a Worker subclass")
        if issubclass(spec.cls, ColocatedWorker):
            raise TypeError(f"role {name!r}: colocated workers cannot be nested")


def colocated_class(roles: Mapping[str, ClassWithInitArgs[Any]]) -> ClassWithInitArgs[ColocatedWorker]:
    """``ClassWithInitArgs`` of a :class:`ColocatedWorker` hosting ``roles`` (checked now)."""
    _check_roles(roles)
    return ClassWithInitArgs(ColocatedWorker, roles=dict(roles))


def colocated_role_classes(spec: ClassWithInitArgs[Any]) -> dict[str, type[Worker]]:
    """``{role: class}`` of a spec made by :func:`colocated_class`."""
    if not issubclass(spec.cls, ColocatedWorker):
        raise TypeError(
            f"{spec.cls.__qualname__} is not a ColocatedWorker; build the group from colocated_class({{...}})"
        )
    if "roles" not in spec.kwargs or spec.args:
        raise ValueError(
            "a ColocatedWorker spec must pass its roles as the keyword 'roles'; use colocated_class({...})"
        )
    roles = spec.kwargs["roles"]
    _check_roles(roles)
    return {name: role.cls for name, role in roles.items()}
