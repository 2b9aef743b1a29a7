"""Loading a config: dataclass defaults ← YAML file(s) ← dotted overrides, parsed once at start-up.

:func:`load_config` is the PPO entry point; :func:`load_structured` is the root-agnostic part,
so another trainer (e.g. an ``SFTConfig`` root with its own rules) loads the same way::

    cfg = load_structured(SFTConfig, files, overrides)
    cfg = finalize_sft_config(cfg)
"""

from __future__ import annotations

import logging
from typing import Any, TypeVar

from hybridflow.config.build import PruneReport, apply, prune, to_dict
from hybridflow.config.errors import ConfigError
from hybridflow.config.ppo import PPOConfig
from hybridflow.config.ppo_rules import finalize_ppo_config
from hybridflow.config.secrets import REDACTED, redacted_secrets
from hybridflow.config.sources import deep_merge, has_interpolation, merge_sources, resolve_interpolations
from hybridflow.config.verl_keys import adapt_verl_tree

logger = logging.getLogger("hybridflow.config")

C = TypeVar("C")


def load_structured(root_cls: type[C], config_files: list[str] | None, overrides: list[str]) -> C:
    """Build ``root_cls`` from its defaults, the YAML files and the overrides (no cross-key rules).

    Unknown keys, wrong types and unreadable sources raise :class:`ConfigError` listing every
    problem; verl-only keys are dropped with one ``ignored: ...`` warning line each.
    """
    tree = merge_sources(config_files, list(overrides))
    placeholders = redacted_secrets(tree)
    if placeholders:
        # A config printed or logged by hybridflow has its secrets replaced; loading it back must
        # not send the placeholder to a server as if it were the key.
        raise ConfigError(
            [
                f"{path}: is {REDACTED!r}, the placeholder of a redacted config print-out, not a secret; give the "
                "real value (your config file, an override, or ${oc.env:VARIABLE} to read it from the environment)"
                for path in placeholders
            ]
        )
    if has_interpolation(tree):
        # Resolved before pruning, so verl-only keys are judged by their values, not "${...}".
        tree = _project(resolve_interpolations(deep_merge(to_dict(root_cls()), tree)), tree)
    report = PruneReport()
    tree = adapt_verl_tree(root_cls, tree, report.problems, report.renamed)
    user = prune(root_cls, tree, report)
    if report.problems:
        raise ConfigError(report.problems)
    _log_report(report)
    defaults = root_cls()
    # Interpolations may point at keys the user did not set, so resolve over defaults + user.
    user = resolve_interpolations_over(defaults, user)
    problems: list[str] = []
    config = apply(defaults, user, problems)
    if problems:
        raise ConfigError(problems)
    return config


def _project(resolved: dict[str, Any], shape: dict[str, Any]) -> dict[str, Any]:
    """The entries of ``resolved`` at the keys ``shape`` has (recursively)."""
    out: dict[str, Any] = {}
    for key, value in shape.items():
        if isinstance(value, dict) and isinstance(resolved.get(key), dict):
            out[key] = _project(resolved[key], value)
        else:
            out[key] = resolved.get(key, value)
    return out


def resolve_interpolations_over(defaults: Any, user: dict[str, Any]) -> dict[str, Any]:
    """``user`` with ``${a.b}`` references resolved against defaults + user (no-op without any)."""
    if not has_interpolation(user):
        return user
    return resolve_interpolations(deep_merge(to_dict(defaults), user))


def _log_report(report: PruneReport) -> None:
    for path, reason in report.ignored:
        logger.warning("ignored: %s (%s)", path, reason)
    for old, new in report.renamed:
        logger.warning("renamed: %s is read as %s", old, new)


def load_config(config_files: list[str] | None = None, overrides: list[str] | None = None) -> PPOConfig:
    """The PPO trainer's config: defaults ← ``config_files`` (in order) ← ``overrides`` (in order).

    ``overrides`` use verl's syntax (``algorithm.adv_estimator=grpo``, ``+key=value``,
    ``key=null``, ``trainer.logger=[console,tensorboard]``). The result is validated and every
    derived default is filled in (see :mod:`hybridflow.config.ppo_rules`); raises
    :class:`ConfigError` naming each bad key and why.
    """
    cfg = load_structured(PPOConfig, config_files, list(overrides or []))
    return finalize_ppo_config(cfg)
