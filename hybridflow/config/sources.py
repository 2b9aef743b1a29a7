"""Reading config sources into one nested dict: YAML files, then dotted command-line overrides.

Override syntax (verl's, i.e. Hydra's):

* ``a.b.c=value``   set a key; the value is read as YAML: ``4``, ``1e-6``, ``true``/``True``,
  ``null``, ``[console,tensorboard]``, ``{temperature: 0.6}``, ``'quoted text'``;
  ``a.b=`` (nothing after ``=``) is the empty string.
* ``+a.b.c=value`` / ``++a.b.c=value``   the same (verl scripts use ``+`` for keys missing
  from verl's YAML; here every key is declared, so the prefix changes nothing).
* ``~a.b.c`` deletes a key set by a file or an earlier override (it returns to its default);
  ``~a.b.c=v`` deletes it only if its value is ``v``.

Values may use ``${other.key}`` interpolation (resolved with OmegaConf after all sources are
merged, e.g. ``trainer.experiment_name=grpo_${actor_rollout_ref.rollout.n}``).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, cast

import yaml
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from hybridflow.config.errors import ConfigError

_KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")


class _YamlLoader(yaml.SafeLoader):
    """SafeLoader that also reads ``1e-6`` as a float (YAML 1.1 needs a dot; Hydra and verl don't)
    and only ``true`` / ``false`` as booleans (as YAML 1.2 and OmegaConf do: YAML 1.1 would turn
    ``rule_reward=off`` or ``answer=yes`` into a bool)."""


_BOOL_TAG = "tag:yaml.org,2002:bool"
_YamlLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != _BOOL_TAG]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_YamlLoader.add_implicit_resolver(_BOOL_TAG, re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF"))
_YamlLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?[0-9][0-9_]*(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)


def parse_yaml(text: str, where: str) -> Any:
    """Parse YAML text (a file's contents or one override value); errors name ``where``."""
    try:
        return yaml.load(text, Loader=_YamlLoader)  # noqa: S506 - SafeLoader subclass
    except yaml.YAMLError as err:
        raise ConfigError(f"{where}: not valid YAML ({err})") from None


def read_yaml_file(path: str | os.PathLike[str]) -> dict[str, Any]:
    """One YAML config file as a nested dict (an empty file is ``{}``)."""
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
    except OSError as err:
        raise ConfigError(f"config file {os.fspath(path)!r} cannot be read: {err.strerror}") from None
    data = parse_yaml(text, f"config file {os.fspath(path)}")
    if data is None:
        return {}
    if not isinstance(data, dict):
        kind = type(data).__name__
        raise ConfigError(f"config file {os.fspath(path)}: top level must be a mapping of keys, got {kind}")
    return data


def parse_override(item: str) -> tuple[str, Any]:
    """``"a.b=3"`` → ``("a.b", 3)``; see the module docstring for the syntax."""
    key, sep, raw = item.lstrip("+").partition("=")
    key = key.strip()
    if not sep:
        raise ConfigError(f"override {item!r} must look like key=value (e.g. trainer.total_epochs=2)")
    if not _KEY_RE.match(key):
        raise ConfigError(f"override {item!r}: {key!r} is not a dotted key like a.b.c")
    value = "" if raw == "" else parse_yaml(raw, f"override {item!r}")
    return key, value


def nest(key: str, value: Any) -> dict[str, Any]:
    """``("a.b.c", v)`` → ``{"a": {"b": {"c": v}}}``."""
    out: Any = value
    for part in reversed(key.split(".")):
        out = {part: out}
    return out


def deep_merge(base: Mapping[str, Any], update: Mapping[str, Any]) -> dict[str, Any]:
    """New dict: ``update`` over ``base``; maps merge key by key, anything else is replaced."""
    merged = dict(base)
    for key, value in update.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def merge_sources(config_files: list[str] | None, overrides: list[str]) -> dict[str, Any]:
    """Merge the YAML files (in order), then the overrides (in order), into one nested dict."""
    merged: dict[str, Any] = {}
    for path in config_files or []:
        merged = deep_merge(merged, read_yaml_file(path))
    for item in overrides:
        if item.startswith("~"):  # hydra's deletion: the key goes back to its default
            merged = delete_key(merged, item)
            continue
        key, value = parse_override(item)
        merged = deep_merge(merged, nest(key, value))
    return merged


def delete_key(tree: dict[str, Any], item: str) -> dict[str, Any]:
    """``~a.b`` (or ``~a.b=v``, deleted only if the value is v): drop ``a.b`` from ``tree``."""
    key, sep, raw = item[1:].partition("=")
    key = key.strip()
    if not _KEY_RE.match(key):
        raise ConfigError(f"override {item!r}: {key!r} is not a dotted key like a.b.c")
    *parents, leaf = key.split(".")
    node: Any = tree
    for part in parents:
        node = node.get(part) if isinstance(node, Mapping) else None
    if not isinstance(node, dict) or leaf not in node:
        return tree  # not set by a file or earlier override: the default already applies
    if sep and node[leaf] != parse_yaml(raw, f"override {item!r}"):
        raise ConfigError(f"override {item!r}: {key} is {node[leaf]!r}, not {raw}; nothing deleted")
    del node[leaf]
    return tree


def has_interpolation(value: Any) -> bool:
    if isinstance(value, str):
        return "${" in value
    if isinstance(value, Mapping):
        return any(has_interpolation(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return any(has_interpolation(v) for v in value)
    return False


def resolve_interpolations(tree: dict[str, Any]) -> dict[str, Any]:
    """Resolve ``${a.b}`` references against ``tree`` itself."""
    try:
        resolved = OmegaConf.to_container(OmegaConf.create(tree), resolve=True)
    except OmegaConfBaseException as err:
        raise ConfigError(f"interpolation failed: {err}".splitlines()[0]) from None
    assert isinstance(resolved, dict)
    return cast(dict[str, Any], resolved)  # the keys are tree's (str); to_container types them as any DictKeyType


def hydra_config_file(config_path: str | None, config_name: str | None) -> str | None:
    """The file named by hydra's ``--config-path DIR --config-name NAME`` (``NAME`` or
    ``NAME.yaml`` in ``DIR``; ``DIR`` defaults to the working folder), or None when no name."""
    if config_name is None:
        if config_path is not None:
            raise ConfigError("--config-path needs --config-name (the YAML file in that folder)")
        return None
    name = config_name if config_name.endswith((".yaml", ".yml")) else f"{config_name}.yaml"
    return str(Path(config_path or ".") / name)
