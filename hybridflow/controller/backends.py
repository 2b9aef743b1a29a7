"""Choosing a backend by name (``trainer.backend``): ``"local"`` or ``"ray"``.

The trainer builds every worker group through :func:`create_worker_group`, so switching
``trainer.backend=ray`` changes where ranks run and nothing else.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from hybridflow.controller.local import LocalWorkerGroup
from hybridflow.controller.resource_pool import ClassWithInitArgs, ResourcePool
from hybridflow.controller.worker_group import WorkerGroup
from hybridflow.utils.registry import Registry

__all__ = ["WORKER_GROUP_BACKENDS", "create_worker_group"]

W = TypeVar("W")

GroupFactory = Callable[[ResourcePool, ClassWithInitArgs[Any]], WorkerGroup[Any]]

WORKER_GROUP_BACKENDS: Registry[GroupFactory] = Registry("worker-group backend")


@WORKER_GROUP_BACKENDS.register("local")
def _local_group(resource_pool: ResourcePool, cls_with_init: ClassWithInitArgs[Any]) -> WorkerGroup[Any]:
    return LocalWorkerGroup(resource_pool, cls_with_init)


@WORKER_GROUP_BACKENDS.register("ray")
def _ray_group(resource_pool: ResourcePool, cls_with_init: ClassWithInitArgs[Any]) -> WorkerGroup[Any]:
    # Imported here so the embedded default never loads ray (an optional dependency).
    from hybridflow.controller.ray_backend import RayWorkerGroup

    return RayWorkerGroup(resource_pool, cls_with_init)


def create_worker_group(
    backend: str, resource_pool: ResourcePool, cls_with_init: ClassWithInitArgs[W]
) -> WorkerGroup[W]:
    """A worker group of ``cls_with_init`` on ``resource_pool`` with the named backend.

    For ``"ray"``, call ``hybridflow.controller.ray_backend.init_ray(trainer.ray_address)``
    first to join a cluster; otherwise a local Ray instance is started.
    """
    return WORKER_GROUP_BACKENDS.get(backend)(resource_pool, cls_with_init)
