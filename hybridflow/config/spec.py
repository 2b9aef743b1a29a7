"""How a config key is declared: ``setting(...)`` / ``section(...)`` and reading those declarations.

Every key of every config is a field of a frozen dataclass declared with :func:`setting` (a leaf
value: default, help text, optional numeric bounds) or :func:`section` (a nested dataclass). The
loader, the validator, the YAML-defaults generator and the documentation table all read these
declarations, so a key exists in exactly one place.

Supported leaf types: ``int``, ``float``, ``bool``, ``str``, ``Literal[...]`` (choices),
``tuple[T, ...]`` (YAML lists), ``dict[str, Any]`` (free-form maps), and any of these ``| None``.
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from collections.abc import Callable, Iterator
from typing import Any, Literal

# Metadata keys stored on each dataclass field.
HELP = "help"
NULL_IS_DEFAULT = "null_is_default"  # verl writes null for "use the default" here
BOUNDS = ("ge", "gt", "le", "lt")
_SECTION = "section"


def setting(
    default: Any = None,
    help: str = "",  # noqa: A002 - reads naturally at declaration sites
    *,
    factory: Callable[[], Any] | None = None,
    ge: float | None = None,
    gt: float | None = None,
    le: float | None = None,
    lt: float | None = None,
    null_is_default: bool = False,
) -> Any:
    """Declare a leaf key: its default, a one-line help text, and optional bounds.

    Bounds apply to numbers (``ge`` ≥, ``gt`` >, ``le`` ≤, ``lt`` <) and are skipped when the
    value is ``None``. Use ``factory`` for a mutable default (``dict``). ``null_is_default``: a
    ``null`` given for this (non-optional) key means its default, as verl's configs use it.
    """
    if not help:
        raise ValueError("every config key needs a help text")
    meta: dict[str, Any] = {HELP: help}
    if null_is_default:
        meta[NULL_IS_DEFAULT] = True
    for name, bound in zip(BOUNDS, (ge, gt, le, lt), strict=True):
        if bound is not None:
            meta[name] = bound
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def section(factory: Callable[[], Any], help: str) -> Any:  # noqa: A002
    """Declare a nested config section built by ``factory`` (a dataclass or a lambda making one)."""
    if not help:
        raise ValueError("every config section needs a help text")
    return dataclasses.field(default_factory=factory, metadata={HELP: help, _SECTION: True})


@functools.cache
def field_types(cls: type) -> dict[str, Any]:
    """Resolved annotations of a config dataclass (string annotations evaluated once)."""
    return typing.get_type_hints(cls)


def config_fields(cls: type) -> dict[str, dataclasses.Field]:
    """The dataclass fields of ``cls`` by name, in declaration order."""
    return {f.name: f for f in dataclasses.fields(cls)}


def is_section(f: dataclasses.Field) -> bool:
    return bool(f.metadata.get(_SECTION, False))


def help_of(f: dataclasses.Field) -> str:
    return str(f.metadata[HELP])


def default_of(f: dataclasses.Field) -> Any:
    """The field's default value (calling its factory if it has one)."""
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return f.default


def bounds_of(f: dataclasses.Field) -> dict[str, float]:
    return {name: f.metadata[name] for name in BOUNDS if name in f.metadata}


def iter_leaves(cls: type, prefix: str = "") -> Iterator[tuple[str, dataclasses.Field, Any]]:
    """Yield ``(dotted_path, field, type)`` for every leaf key under ``cls``, depth first."""
    types_ = field_types(cls)
    for name, f in config_fields(cls).items():
        path = f"{prefix}{name}"
        if is_section(f):
            yield from iter_leaves(types_[name], f"{path}.")
        else:
            yield path, f, types_[name]


def iter_sections(cls: type, prefix: str = "") -> Iterator[tuple[str, type, str]]:
    """Yield ``(dotted_path, section_class, help)`` for every nested section under ``cls``."""
    types_ = field_types(cls)
    for name, f in config_fields(cls).items():
        if is_section(f):
            path = f"{prefix}{name}"
            yield path, types_[name], help_of(f)
            yield from iter_sections(types_[name], f"{path}.")


def all_paths(cls: type) -> list[str]:
    """Every valid dotted key under ``cls``: sections and leaves."""
    paths = [path for path, _, _ in iter_sections(cls)]
    paths += [path for path, _, _ in iter_leaves(cls)]
    return paths


# --- describing types (for error messages and documentation) -------------------------------


def union_args(tp: Any) -> tuple[Any, ...] | None:
    """The members of ``A | B`` / ``Optional[A]``, or None if ``tp`` is not a union."""
    if isinstance(tp, types.UnionType) or typing.get_origin(tp) is typing.Union:
        return typing.get_args(tp)
    return None


def is_literal(tp: Any) -> bool:
    return typing.get_origin(tp) is Literal


def describe_type(tp: Any) -> str:
    """Human-readable type: ``int``, ``float | null``, ``'token' | 'sequence'``, ``list[str]``."""
    members = union_args(tp)
    if members is not None:
        return " | ".join(describe_type(m) for m in members)
    if tp is type(None):
        return "null"
    if is_literal(tp):
        return " | ".join(repr(a) for a in typing.get_args(tp))
    origin = typing.get_origin(tp)
    if origin is tuple:
        return f"list[{describe_type(typing.get_args(tp)[0])}]"
    if origin is dict:
        return "map"
    if tp is Any:
        return "any"
    return getattr(tp, "__name__", str(tp))
