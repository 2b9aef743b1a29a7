"""``WorkerGroup[W]``: the controller's handle on the ranks that run worker class ``W``.

One front, two backends (``LocalWorkerGroup`` in-process, ``RayWorkerGroup`` on Ray actors).
A call goes: dispatch fn → one argument tuple per rank → the backend runs the method on each
rank → collect fn merges the outputs (→ auto-padding removed).

How the controller names a worker method — three explicit ways, all driven by the table
``wg.methods`` (``{name: MethodSpec}``, read from ``W``'s ``@register`` methods when the group
is built):

* ``wg.call(ActorWorker.update_actor, batch)`` — typed: a checker verifies the method belongs
  to ``W`` and the arguments match its signature; go-to-definition lands on the worker method;
* ``wg.update_actor(batch)`` — the same call through :meth:`__getattr__`, which only answers
  names in ``wg.methods`` (nothing is added to the class or the instance);
* ``wg.execute_all("name", ...)`` / ``wg.execute_rank_zero("name", ...)`` — by name, any method.

For a fully typed attribute style a role can wrap its group in an explicit handle::

    class ActorHandle:
        def __init__(self, wg: WorkerGroup[ActorWorker]) -> None:
            self.wg = wg

        def update_actor(self, data: DataProto) -> DataProto:
            return self.wg.call(ActorWorker.update_actor, data)
"""

from __future__ import annotations

import functools
import traceback
from collections.abc import Callable
from typing import Any, Concatenate, Generic, ParamSpec, Protocol, TypeVar

from hybridflow.controller.decorator import Execute, MethodSpec, method_spec, registered_methods
from hybridflow.controller.dispatch import (
    DispatchContext,
    DispatchMode,
    MeshRank,
    dispatch_all_to_all,
    finish_collect,
    run_dispatch,
)
from hybridflow.controller.host import HostInfo
from hybridflow.protocol import DataProtoFuture

__all__ = ["WorkerGroup", "GroupMethod", "RankBackend", "describe_exception"]

W = TypeVar("W")
R = TypeVar("R")
P = ParamSpec("P")

PerRank = list[tuple[tuple[Any, ...], dict[str, Any]]]


class RankBackend(Protocol):
    """What a backend provides to the front. ``handles`` are opaque (values or ObjectRefs)."""

    @property
    def world_size(self) -> int: ...

    def submit(self, ranks: list[int], role: str | None, method: str, per_rank: PerRank, label: str) -> list[Any]:
        """Start ``method`` on each of ``ranks`` with its arguments; returns one handle per rank."""
        ...

    def wait(self, handles: list[Any], ranks: list[int], label: str) -> list[Any]:
        """The outputs, in ``ranks`` order; raises ``WorkerError`` naming the failing rank."""
        ...

    def host_infos(self) -> list[HostInfo]: ...

    def shutdown(self) -> None: ...


def describe_exception(exc: BaseException) -> tuple[str, str]:
    """``("Type: message", full traceback text)`` of an exception."""
    return f"{type(exc).__name__}: {exc}", "".join(traceback.format_exception(exc))


class GroupMethod:
    """A registered worker method seen from the controller: ``wg.update_actor(batch)``."""

    def __init__(self, group: WorkerGroup[Any], name: str) -> None:
        self._group = group
        self.name = name
        self.spec: MethodSpec = group.methods[name]

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._group._invoke(self.name, self.spec, args, kwargs)

    def __repr__(self) -> str:
        return f"<group method {self._group.worker_cls.__qualname__}.{self.name} [{self.spec.dispatch_mode}]>"


class WorkerGroup(Generic[W]):
    """Ranks running ``worker_cls`` (or role ``role`` of a colocated worker) behind ``backend``."""

    def __init__(
        self,
        backend: RankBackend,
        worker_cls: type[W],
        role: str | None = None,
        colocated_roles: dict[str, type] | None = None,
        owns_backend: bool = True,
    ) -> None:
        self._backend = backend
        self.worker_cls = worker_cls
        self.role = role
        self._colocated_roles = dict(colocated_roles or {})
        self._owns_backend = owns_backend
        self._mesh_cache: dict[str, tuple[MeshRank, ...]] = {}
        self.methods: dict[str, MethodSpec] = registered_methods(worker_cls)
        for name, spec in self.methods.items():
            try:
                spec.mode()
            except (ValueError, TypeError) as exc:
                raise ValueError(f"{worker_cls.__qualname__}.{name}: bad dispatch mode: {exc}") from None

    # --- facts ----------------------------------------------------------------------------------
    @property
    def world_size(self) -> int:
        return self._backend.world_size

    def host_infos(self) -> list[HostInfo]:
        """pid and node address of every rank's process, in rank order."""
        return self._backend.host_infos()

    # --- calling registered methods ---------------------------------------------------------
    def call(self, method: Callable[Concatenate[W, P], Any], *args: P.args, **kwargs: P.kwargs) -> Any:
        """Call a ``@register`` method of ``W`` on the ranks: ``wg.call(ActorWorker.update_actor, batch)``."""
        name = getattr(method, "__name__", None)
        if method_spec(method) is None or name is None:
            raise TypeError(f"{method!r} is not a @register-marked worker method")
        if name not in self.methods or not any(vars(k).get(name) is method for k in self.worker_cls.__mro__):
            raise TypeError(
                f"{getattr(method, '__qualname__', name)} is not a method of {self.worker_cls.__qualname__}; "
                f"registered: {sorted(self.methods)}"
            )
        return self._invoke(name, self.methods[name], args, kwargs)

    def __getattr__(self, name: str) -> GroupMethod:
        # Only reached for names that are not real attributes; answers the registered ones.
        methods = self.__dict__.get("methods")
        if methods is None or name not in methods:
            cls = self.__dict__.get("worker_cls")
            owner = cls.__qualname__ if cls is not None else "the worker"
            raise AttributeError(f"{owner} has no @register method {name!r}; registered: {sorted(methods or {})}")
        return GroupMethod(self, name)

    def execute_all(self, method_name: str, *args: Any, **kwargs: Any) -> list[Any]:
        """Run ``method_name`` on every rank (arguments per rank if each is a list of world_size, else broadcast)."""
        plan = dispatch_all_to_all(self._context(None), *args, **kwargs)
        ranks = list(range(self.world_size))
        per_rank = [plan.for_rank(r) for r in ranks]
        label = self._label(method_name)
        return self._backend.wait(self._backend.submit(ranks, self.role, method_name, per_rank, label), ranks, label)

    def execute_rank_zero(self, method_name: str, *args: Any, **kwargs: Any) -> Any:
        """Run ``method_name`` on rank 0 only and return its output."""
        label = self._label(method_name)
        handles = self._backend.submit([0], self.role, method_name, [(args, kwargs)], label)
        return self._backend.wait(handles, [0], label)[0]

    def _invoke(self, name: str, spec: MethodSpec, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        mode = spec.mode()
        ctx = self._context(mode)
        plan = run_dispatch(mode, ctx, args, kwargs)
        ranks = [0] if spec.execute_mode is Execute.RANK_ZERO else list(range(self.world_size))
        label = self._label(name)
        handles = self._backend.submit(ranks, self.role, name, [plan.for_rank(r) for r in ranks], label)
        if spec.blocking:
            return finish_collect(mode.collect_fn, ctx, plan.pad_size, self._backend.wait(handles, ranks, label))
        # A partial of module-level functions pickles, so the future can travel to other workers.
        collect = functools.partial(finish_collect, mode.collect_fn, ctx, plan.pad_size)
        return DataProtoFuture(collect_fn=collect, futures=handles)

    def _context(self, mode: DispatchMode | None) -> DispatchContext:
        mesh_name = mode.mesh_name if mode is not None else None
        if mesh_name is not None and mesh_name not in self._mesh_cache:
            self._mesh_cache[mesh_name] = tuple(self.execute_all("get_dispatch_info", mesh_name))
        return DispatchContext(world_size=self.world_size, meshes=dict(self._mesh_cache))

    def _label(self, method: str) -> str:
        prefix = f"{self.role}:" if self.role is not None else ""
        return f"{prefix}{self.worker_cls.__qualname__}.{method}"

    # --- colocation -------------------------------------------------------------------------
    def spawn(self) -> dict[str, WorkerGroup[Any]]:
        """One group per colocated role, over the same ranks; each exposes only its role's methods."""
        if not self._colocated_roles:
            raise TypeError(
                "spawn() needs a group built from colocated_class({...}); "
                f"this one runs {self.worker_cls.__qualname__}"
            )
        return {
            name: WorkerGroup(self._backend, cls, role=name, owns_backend=False)
            for name, cls in self._colocated_roles.items()
        }

    def role_group(self, name: str, cls: type[R]) -> WorkerGroup[R]:
        """Typed ``spawn()[name]``: checks that role ``name`` runs ``cls``."""
        if name not in self._colocated_roles:
            raise ValueError(f"unknown role {name!r}; this group hosts {sorted(self._colocated_roles) or 'no roles'}")
        if self._colocated_roles[name] is not cls:
            raise TypeError(f"role {name!r} runs {self._colocated_roles[name].__qualname__}, not {cls.__qualname__}")
        return WorkerGroup(self._backend, cls, role=name, owns_backend=False)

    # --- lifetime -----------------------------------------------------------------------------
    def shutdown(self) -> None:
        """Stop the ranks (only the group that created them does; role groups share them)."""
        if self._owns_backend:
            self._backend.shutdown()

    def __enter__(self) -> WorkerGroup[W]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()
