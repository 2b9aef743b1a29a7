"""The single-controller runtime: workers, ``@register`` dispatch modes, worker groups.

The in-process backend is imported here; the Ray backend lives in
``hybridflow.controller.ray_backend`` (imported on demand so the default never loads ray).
"""

from hybridflow.controller.backends import WORKER_GROUP_BACKENDS, create_worker_group
from hybridflow.controller.colocate import ColocatedWorker, colocated_class, colocated_role_classes
from hybridflow.controller.decorator import Execute, MethodSpec, register, registered_methods
from hybridflow.controller.dispatch import (
    DISPATCH_MODES,
    Dispatch,
    DispatchContext,
    Dispatched,
    DispatchMode,
    MeshRank,
    make_nd_compute_dataproto_dispatch_fn,
    register_dispatch_mode,
)
from hybridflow.controller.errors import WorkerDiedError, WorkerError, WorkerTimeoutError
from hybridflow.controller.local import LocalWorkerGroup
from hybridflow.controller.resource_pool import ClassWithInitArgs, ResourcePool
from hybridflow.controller.worker import RankInfo, Worker
from hybridflow.controller.worker_group import GroupMethod, WorkerGroup

__all__ = [
    "DISPATCH_MODES",
    "WORKER_GROUP_BACKENDS",
    "ClassWithInitArgs",
    "ColocatedWorker",
    "Dispatch",
    "DispatchContext",
    "DispatchMode",
    "Dispatched",
    "Execute",
    "GroupMethod",
    "LocalWorkerGroup",
    "MeshRank",
    "MethodSpec",
    "RankInfo",
    "ResourcePool",
    "Worker",
    "WorkerDiedError",
    "WorkerError",
    "WorkerGroup",
    "WorkerTimeoutError",
    "colocated_class",
    "colocated_role_classes",
    "create_worker_group",
    "make_nd_compute_dataproto_dispatch_fn",
    "register",
    "register_dispatch_mode",
    "registered_methods",
]
