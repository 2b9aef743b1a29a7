"""Nested dicts ⇄ config dataclasses, against the declarations in the schema.

* :func:`prune` walks user keys against the schema: drops verl-only keys (reported as ignored),
  renames renamed verl keys, and reports unknown keys with the closest valid key.
* :func:`apply` builds a new config from a default instance and a nested dict of user values,
  checking each value's type (errors name the dotted key).
* :func:`check_leaves` checks types and declared bounds of every leaf of a built config.
* :func:`to_dict` turns a config back into plain nested dicts/lists (for YAML).
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from hybridflow.config.coerce import CoercionError, coerce
from hybridflow.config.errors import ConfigError
from hybridflow.config.spec import (
    NULL_IS_DEFAULT,
    all_paths,
    bounds_of,
    config_fields,
    field_types,
    is_section,
    iter_leaves,
)
from hybridflow.config.verl_compat import find_ignored, renamed_to

C = TypeVar("C")


@dataclasses.dataclass
class PruneReport:
    """What :func:`prune` found: keys ignored (with reasons), renamed, and problems."""

    ignored: list[tuple[str, str]] = dataclasses.field(default_factory=list)
    renamed: list[tuple[str, str]] = dataclasses.field(default_factory=list)
    problems: list[str] = dataclasses.field(default_factory=list)


def prune(cls: type, tree: Mapping[str, Any], report: PruneReport) -> dict[str, Any]:
    """Copy of ``tree`` holding only keys declared under ``cls``; everything else goes to ``report``."""
    return _prune(cls, tree, report, "", all_paths(cls))


def _prune(cls: type, tree: Mapping[str, Any], report: PruneReport, prefix: str, every: list[str]) -> dict[str, Any]:
    fields = config_fields(cls)
    types_ = field_types(cls)
    kept: dict[str, Any] = {}
    for key, value in tree.items():
        if not isinstance(key, str):
            report.problems.append(f"{prefix or '<top level>'}: keys must be text, got {key!r}")
            continue
        path = f"{prefix}{key}"
        new_name = renamed_to(path) if key not in fields else None
        if new_name is not None and value is None:
            continue  # verl leaves its old name null when the new one is set (optim.warmup_style)
        if new_name is not None:
            report.renamed.append((path, f"{prefix}{new_name}"))
            if new_name in tree:  # both names: fine with the same value (verl's files carry both)
                if tree[new_name] != value:
                    report.problems.append(f"{path}: verl's name for {prefix}{new_name}; give only one of them")
                continue
            key, path = new_name, f"{prefix}{new_name}"
        if key not in fields:
            _unknown(path, value, list(fields), every, report)
        elif not is_section(fields[key]):
            kept[key] = value
        elif isinstance(value, Mapping):
            kept[key] = _prune(types_[key], value, report, f"{path}.", every)
        else:
            report.problems.append(f"{path}: is a section; set its keys (e.g. {path}.<key>=...), got {value!r}")
    return kept


def _unknown(path: str, value: Any, siblings: list[str], every: list[str], report: PruneReport) -> None:
    entry = find_ignored(path)
    if entry is None and isinstance(value, Mapping) and value and _listed_below(path, value):
        for key, item in value.items():  # a section whose keys the verl tables list one by one
            _unknown(f"{path}.{key}", item, list(value), every, report)
        return
    if entry is not None and entry.accepts(value):
        report.ignored.append((path, entry.reason))
    elif entry is not None:
        report.problems.append(f"{path}: not supported by hybridflow ({entry.reason})")
    else:
        report.problems.append(f"{path}: unknown key{suggest(path, siblings, every)}")


def _listed_below(path: str, value: Mapping[str, Any]) -> bool:
    """Whether some key of the section ``path`` is in the verl tables (e.g. verl's model.lora.type)."""
    return any(
        find_ignored(f"{path}.{key}") is not None
        or (isinstance(item, Mapping) and item and _listed_below(f"{path}.{key}", item))
        for key, item in value.items()
    )


def suggest(path: str, siblings: list[str], every: list[str]) -> str:
    """``"; did you mean X?"`` for the closest valid key, or ``""`` when nothing is close.

    Tries, in order: the same name in another section (a key put in the wrong place), a sibling
    with a similar name (a typo), a similar full path anywhere.
    """
    prefix, _, leaf = path.rpartition(".")
    same_leaf = [p for p in every if p.rpartition(".")[2] == leaf]
    if same_leaf:
        return f"; did you mean {difflib.get_close_matches(path, same_leaf, n=1, cutoff=0.0)[0]}?"
    near = difflib.get_close_matches(leaf, siblings, n=1, cutoff=0.7)
    if near:
        return f"; did you mean {prefix + '.' if prefix else ''}{near[0]}?"
    near = difflib.get_close_matches(path, every, n=1, cutoff=0.75)
    return f"; did you mean {near[0]}?" if near else ""


def apply(instance: Any, tree: Mapping[str, Any], problems: list[str], prefix: str = "") -> Any:
    """New instance: ``instance`` with the (pruned) user values of ``tree`` coerced to key types."""
    cls: type = type(instance)
    fields = config_fields(cls)
    types_ = field_types(cls)
    changes: dict[str, Any] = {}
    for key, value in tree.items():
        path = f"{prefix}{key}"
        if is_section(fields[key]):
            changes[key] = apply(getattr(instance, key), value, problems, f"{path}.")
            continue
        if value is None and fields[key].metadata.get(NULL_IS_DEFAULT):
            continue  # verl's null: the default
        try:
            changes[key] = coerce(value, types_[key])
        except CoercionError as err:
            problems.append(f"{path}: {err}")
    return dataclasses.replace(instance, **changes)


def check_leaves(config: Any) -> list[str]:
    """Type and bound problems of every leaf of a built config (dotted key: why)."""
    problems: list[str] = []
    for path, f, tp in iter_leaves(type(config)):
        value = lookup(config, path)
        try:
            coerce(value, tp)
        except CoercionError as err:
            problems.append(f"{path}: {err}")
            continue
        problems += _bound_problems(path, value, bounds_of(f))
    return problems


def finalize_config(
    cfg: C,
    resolve: Callable[[C], C],
    rules: Sequence[Callable[[C], list[str]]],
    checks: Sequence[Callable[[C], list[str]]] = (),
) -> C:
    """Per-key checks of ``cfg`` (:func:`check_leaves`, then the extra ``checks``), then ``resolve``
    (derived defaults), then the cross-key ``rules`` on the resolved config; each of the two check
    stages raises one :class:`ConfigError` with all its problems. Every trainer's config goes
    through this sequence (PPO, SFT, reward model)."""
    problems = check_leaves(cfg)
    for check in checks:
        problems += check(cfg)
    if problems:
        raise ConfigError(problems)
    resolved = resolve(cfg)
    problems = [p for rule in rules for p in rule(resolved)]
    if problems:
        raise ConfigError(problems)
    return resolved


def _bound_problems(path: str, value: Any, bounds: dict[str, float]) -> list[str]:
    if value is None or isinstance(value, bool) or not isinstance(value, (int, float)):
        return []
    checks = {
        "ge": (value >= bounds.get("ge", value), "≥"),
        "gt": ("gt" not in bounds or value > bounds["gt"], ">"),
        "le": (value <= bounds.get("le", value), "≤"),
        "lt": ("lt" not in bounds or value < bounds["lt"], "<"),
    }
    return [
        f"{path}: must be {symbol} {bounds[name]:g}, got {value!r}"
        for name, (ok, symbol) in checks.items()
        if name in bounds and not ok
    ]


def lookup(config: Any, path: str) -> Any:
    """``lookup(cfg, "actor_rollout_ref.rollout.n")`` → ``cfg.actor_rollout_ref.rollout.n``."""
    value = config
    for part in path.split("."):
        value = getattr(value, part)
    return value


def to_dict(config: Any) -> dict[str, Any]:
    """Plain nested dicts and lists (tuples become lists) — YAML- and JSON-ready."""
    return {f.name: _plain(getattr(config, f.name)) for f in dataclasses.fields(config)}


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return to_dict(value)
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    return value
