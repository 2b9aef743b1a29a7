"""The one registry mechanism behind every pluggable axis.

Advantage estimators, policy losses, KL estimators, reward managers, scorers, rollout
backends and training engines are all looked up by name through a :class:`Registry`.
An entry may carry a small metadata object (e.g. what an advantage estimator needs), so
callers derive behaviour from the declaration instead of branching on names.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar

T = TypeVar("T")


def _key(name: str | enum.Enum) -> str:
    if isinstance(name, enum.Enum):
        return str(name.value)
    if not isinstance(name, str):
        raise TypeError(f"registry names are str or Enum, got {type(name).__name__}: {name!r}")
    return name


class Registry(Generic[T]):
    """Name → object table with verl's registration rules.

    * registering the same object twice under a name is a no-op;
    * a different object under a taken name raises ``ValueError``;
    * lookup is case-sensitive; an unknown name raises ``ValueError`` listing valid names.
    """

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._entries: dict[str, T] = {}
        self._meta: dict[str, Any] = {}

    def register(self, name: str | enum.Enum, meta: Any = None) -> Callable[[T], T]:
        """Decorator: ``@REG.register("grpo", meta=Needs(index=True))``."""

        def decorator(obj: T) -> T:
            self.add(name, obj, meta)
            return obj

        return decorator

    def add(self, name: str | enum.Enum, obj: T, meta: Any = None) -> None:
        key = _key(name)
        existing = self._entries.get(key)
        if existing is not None:
            if existing is obj:
                return
            raise ValueError(
                f"{self.kind} {key!r} is already registered to {_describe(existing)}; "
                f"refusing to replace it with {_describe(obj)}"
            )
        self._entries[key] = obj
        self._meta[key] = meta

    def get(self, name: str | enum.Enum) -> T:
        key = _key(name)
        try:
            return self._entries[key]
        except KeyError:
            raise ValueError(f"unknown {self.kind} {key!r}; valid names: {', '.join(sorted(self._entries))}") from None

    def meta(self, name: str | enum.Enum) -> Any:
        """The metadata registered with ``name`` (``None`` if none was given)."""
        self.get(name)  # same error for unknown names
        return self._meta[_key(name)]

    def names(self) -> list[str]:
        return sorted(self._entries)

    def __contains__(self, name: object) -> bool:
        try:
            return _key(name) in self._entries  # type: ignore[arg-type]
        except TypeError:
            return False

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, {self.names()})"


def _describe(obj: object) -> str:
    module = getattr(obj, "__module__", "?")
    name = getattr(obj, "__qualname__", type(obj).__name__)
    return f"{module}.{name}"
