"""Checking one value against a declared key type, converting where the conversion is lossless.

Conversions allowed (everything else is a type error naming the key):

* ``float`` keys accept ints (``lr=1`` → 1.0);
* ``str`` keys accept ints and floats (``trainer.experiment_name=2024`` → "2024"), never bools
  (YAML reads ``off``/``yes`` as bools, which is almost always a mistake for a string key);
* list keys accept a single item (``trainer.logger=console`` → ["console"]) and store tuples, so
  a frozen config stays immutable;
* map keys accept any mapping;
* ``bool`` keys accept nothing but booleans (:func:`hybridflow.utils.booleans.parse_bool`, the
  rule every boolean read from a file follows): a quoted ``"false"`` or a ``0`` is an error.
"""

from __future__ import annotations

import typing
from collections.abc import Mapping
from typing import Any

from hybridflow.config.spec import describe_type, is_literal, union_args
from hybridflow.utils.booleans import parse_bool


class CoercionError(Exception):
    """A value does not fit its key's type; the message says what was expected."""


def coerce(value: Any, tp: Any) -> Any:
    """Return ``value`` converted to type ``tp`` or raise :class:`CoercionError`."""
    members = union_args(tp)
    if members is not None:
        return _coerce_union(value, members, tp)
    if tp is Any:
        return value
    if tp is type(None):
        if value is None:
            return None
        raise CoercionError(_expected(tp, value))
    if is_literal(tp):
        return _coerce_literal(value, tp)
    origin = typing.get_origin(tp)
    if origin is tuple:
        return _coerce_tuple(value, tp)
    if origin is dict:
        if isinstance(value, Mapping):
            return dict(value)
        raise CoercionError(_expected(tp, value))
    return _coerce_scalar(value, tp)


def _coerce_union(value: Any, members: tuple[Any, ...], tp: Any) -> Any:
    if value is None:
        if type(None) in members:
            return None
        raise CoercionError(_expected(tp, value))
    literal_problem = None
    for member in members:
        if member is type(None):
            continue
        try:
            return coerce(value, member)
        except CoercionError as err:
            if is_literal(member):
                literal_problem = str(err)
    # A choice key that got a wrong string: say which choices exist, not "expected str".
    raise CoercionError(literal_problem or _expected(tp, value))


def _coerce_literal(value: Any, tp: Any) -> Any:
    choices = typing.get_args(tp)
    if isinstance(value, str) and value in choices:
        return value
    listed = ", ".join(repr(c) for c in choices)
    raise CoercionError(f"must be one of {listed}; got {_show(value)}")


def _coerce_tuple(value: Any, tp: Any) -> tuple[Any, ...]:
    (item_tp, _ellipsis) = typing.get_args(tp)
    items = value if isinstance(value, (list, tuple)) else [value]
    out = []
    for index, item in enumerate(items):
        try:
            out.append(coerce(item, item_tp))
        except CoercionError as err:
            raise CoercionError(f"item [{index}]: {err}") from None
    return tuple(out)


def _coerce_scalar(value: Any, tp: Any) -> Any:
    if tp is bool:
        try:
            return parse_bool(value, "value")  # the one strict rule for booleans; the key is named by the caller
        except ValueError:
            pass
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    elif tp is str:
        if isinstance(value, str):
            return value
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return str(value)
        if isinstance(value, bool):
            raise CoercionError(f"{_expected(tp, value)} (quote it if you meant the text)")
    else:
        raise TypeError(f"config keys cannot have type {tp!r}")
    raise CoercionError(_expected(tp, value))


def _expected(tp: Any, value: Any) -> str:
    return f"expected {describe_type(tp)}, got {_show(value)}"


def _show(value: Any) -> str:
    if value is None:
        return "null"
    kind = "list" if isinstance(value, (list, tuple)) else type(value).__name__
    if isinstance(value, Mapping):
        kind = "map"
    return f"{kind} {value!r}"
