"""``@register``: mark a worker method as callable from the controller, with its dispatch mode.

::

    class ActorWorker(Worker):
        @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
        def update_actor(self, data: DataProto) -> DataProto: ...

The decorator records a :class:`MethodSpec` on the function (attribute ``__hybridflow_method__``)
and, with ``materialize_futures=True``, resolves ``DataProtoFuture`` arguments inside the worker
before the body runs (so a non-blocking call's result can feed the next call without passing
through the controller). :func:`registered_methods` lists a class's marked methods; worker
groups read that list once at construction and expose it as ``wg.methods``.
"""

from __future__ import annotations

import enum
import functools
import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from hybridflow.controller.dispatch import Dispatch, DispatchMode, resolve_dispatch_mode
from hybridflow.protocol import DataProtoFuture

__all__ = ["Execute", "MethodSpec", "register", "registered_methods", "method_spec", "SPEC_ATTR"]

SPEC_ATTR = "__hybridflow_method__"

F = TypeVar("F", bound=Callable[..., Any])


class Execute(str, enum.Enum):
    """Which ranks run the call: every rank, or rank 0 only."""

    ALL = "ALL"
    RANK_ZERO = "RANK_ZERO"


@dataclass(frozen=True)
class MethodSpec:
    """How the controller calls one worker method.

    ``execute_mode`` is already resolved: ``Dispatch.RANK_ZERO`` always runs on rank 0 only.
    """

    name: str
    dispatch_mode: Dispatch | str | DispatchMode | Mapping[str, Any]
    execute_mode: Execute
    blocking: bool
    materialize_futures: bool

    def mode(self) -> DispatchMode:
        return resolve_dispatch_mode(self.dispatch_mode)


def register(
    dispatch_mode: Dispatch | str | DispatchMode | Mapping[str, Any] = Dispatch.ALL_TO_ALL,
    execute_mode: Execute = Execute.ALL,
    blocking: bool = True,
    materialize_futures: bool = True,
) -> Callable[[F], F]:
    """Mark a worker method for the controller.

    Args:
        dispatch_mode: a :class:`Dispatch` member, the name of a mode added with
            ``register_dispatch_mode``, a :class:`DispatchMode`, or verl's
            ``{"dispatch_fn": ..., "collect_fn": ...}`` dict.
        execute_mode: ``Execute.ALL`` or ``Execute.RANK_ZERO``.
        blocking: False → the group call returns a ``DataProtoFuture`` at once.
        materialize_futures: resolve ``DataProtoFuture`` arguments in the worker first.
    """
    if not isinstance(execute_mode, Execute):
        raise TypeError(f"execute_mode must be an Execute member, got {execute_mode!r}")
    if not isinstance(dispatch_mode, Dispatch | str | DispatchMode | Mapping):
        raise TypeError(
            f"dispatch_mode must be a Dispatch, a registered name, a DispatchMode or a dict; got {dispatch_mode!r}"
        )
    if dispatch_mode is Dispatch.RANK_ZERO:
        execute_mode = Execute.RANK_ZERO

    def decorator(func: F) -> F:
        spec = MethodSpec(func.__name__, dispatch_mode, execute_mode, bool(blocking), bool(materialize_futures))
        target: Callable[..., Any] = func
        if materialize_futures:
            target = _materializing(func)
        # Marking the function object is how the group finds it; no method is added anywhere.
        setattr(target, SPEC_ATTR, spec)
        return target  # type: ignore[return-value]

    return decorator


def _materializing(func: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(func)
    def inner(*args: Any, **kwargs: Any) -> Any:
        args = tuple(a.get() if isinstance(a, DataProtoFuture) else a for a in args)
        kwargs = {k: v.get() if isinstance(v, DataProtoFuture) else v for k, v in kwargs.items()}
        return func(*args, **kwargs)

    return inner


def method_spec(func: Any) -> MethodSpec | None:
    """The :class:`MethodSpec` of a ``@register``-marked function, else None."""
    spec = getattr(func, SPEC_ATTR, None)
    return spec if isinstance(spec, MethodSpec) else None


def registered_methods(cls: type) -> dict[str, MethodSpec]:
    """``{name: spec}`` of every ``@register`` method of ``cls`` (own and inherited), by name.

    Walks ``cls.__mro__`` class dictionaries; an override that drops ``@register`` from a
    registered base method is an error (the controller could not know how to dispatch it).
    """
    if not isinstance(cls, type):
        raise TypeError(f"registered_methods expects a class, got {type(cls).__name__}")
    found: dict[str, MethodSpec] = {}
    marked_in_bases: set[str] = set()
    for klass in cls.__mro__:
        for name, value in vars(klass).items():
            if method_spec(value) is not None:
                marked_in_bases.add(name)
    for name in sorted(marked_in_bases):
        resolved = inspect.getattr_static(cls, name)
        spec = method_spec(resolved)
        if spec is None:
            raise TypeError(
                f"{cls.__qualname__}.{name} overrides a @register method without @register; "
                "decorate the override with the dispatch mode it should use"
            )
        found[name] = spec
    return found
