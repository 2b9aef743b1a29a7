"""What hybridflow does with one verl config key: the one answer the loader, the docs table,
``scripts/verl_config_keys.py`` and the tests share.

:func:`explain_verl_key` walks a dotted verl key the way loading does: moved keys first (PPO
and SFT each have their table), then the schema level by level, a renamed name, and at the
first level the schema lacks, the ignored/accepted-while-off tables of ``verl_compat``.
:func:`adapt_verl_tree` is the loader's step that applies the moves before the schema walk.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any, Literal

from hybridflow.config.ppo import PPOConfig
from hybridflow.config.sft import SFTConfig
from hybridflow.config.spec import config_fields, field_types, is_section
from hybridflow.config.verl_compat import VERL_MOVED_KEYS, find_ignored, move_keys, renamed_to
from hybridflow.config.verl_key_types import MovedKey
from hybridflow.config.verl_keys_new import LORA_SECTIONS, SFT_MOVED_KEYS

logger = logging.getLogger("hybridflow.config")

Status = Literal["honoured", "moved", "renamed", "ignored", "off_only", "unknown"]


@dataclass(frozen=True)
class KeyFate:
    """``status`` and, for honoured/moved/renamed keys, our key (``ours``); else the reason."""

    status: Status
    ours: str = ""
    reason: str = ""


def moved_table(root: type) -> tuple[MovedKey, ...]:
    """The moved keys loading applies for a config root (none for other roots)."""
    return {PPOConfig: VERL_MOVED_KEYS, SFTConfig: SFT_MOVED_KEYS}.get(root, ())


def classify_verl_key(path: str, root: type = PPOConfig) -> Status:
    """``"honoured"``, ``"moved"``, ``"renamed"``, ``"ignored"``, ``"off_only"`` or ``"unknown"``."""
    return explain_verl_key(path, root).status


def explain_verl_key(path: str, root: type = PPOConfig) -> KeyFate:
    """The fate of the verl key ``path`` when a config of ``root`` is loaded."""
    for entry in moved_table(root):
        if path == entry.old or path.startswith(entry.old + "."):
            new = entry.new + path[len(entry.old) :]
            target = explain_verl_key(new, root)
            if target.status == "unknown":
                return target
            return KeyFate("moved", target.ours or new, _then(target))
    return _walk(path, root)


def _then(target: KeyFate) -> str:
    """The reason of a moved or renamed key: what happens at its new name, unless it is read there."""
    return "" if target.status in ("honoured", "moved", "renamed") else f"{target.status}: {target.reason}"


def _walk(path: str, root: type) -> KeyFate:
    """The schema walk of loading (``build.prune``): our keys level by level, then the tables."""
    cls, prefix = root, ""
    parts = path.split(".")
    for i, part in enumerate(parts):
        fields = config_fields(cls)
        here = prefix + part
        if part not in fields:
            new_name = renamed_to(here)
            if new_name is not None and new_name in fields:
                target = _walk(".".join([prefix + new_name, *parts[i + 1 :]]), root)
                if target.status == "unknown":
                    return target
                return KeyFate("renamed", target.ours or ".".join([prefix + new_name, *parts[i + 1 :]]), _then(target))
            return _listed(parts, i)
        if not is_section(fields[part]):
            return KeyFate("honoured", here)  # deeper parts sit inside a map-valued setting
        cls, prefix = field_types(cls)[part], here + "."
    return KeyFate("honoured", path)


def _listed(parts: list[str], first_unknown: int) -> KeyFate:
    """The verl-table entry of the shortest listed key from the first level the schema lacks
    (as loading looks a section up whole, then key by key)."""
    for end in range(first_unknown + 1, len(parts) + 1):
        entry = find_ignored(".".join(parts[:end]))
        if entry is not None:
            return KeyFate("off_only" if entry.only_when_off else "ignored", reason=entry.reason)
    return KeyFate("unknown", reason="not a hybridflow key and not in the verl tables")


def adapt_verl_tree(root: type, tree: dict[str, Any], problems: list[str], moved: list[tuple[str, str]]) -> dict:
    """``tree`` with verl's other homes of our keys moved to ours (in place), before the schema walk.

    A LoRA section left off (``rank`` 0, or absent with the model's ``lora_rank`` 0) is dropped
    with one warning: verl's Megatron file carries one beside the FSDP keys with other values, and
    off they set nothing. Values in verl's units are converted (``staleness_threshold``).
    """
    if root is PPOConfig:
        for section in LORA_SECTIONS:
            _drop_off_lora(tree, section)
        _staleness_in_versions(tree)
    if root is SFTConfig and isinstance(tree.get("data"), dict) and tree["data"].get("val_files", ()) is None:
        tree["data"]["val_files"] = []  # verl's null and hybridflow's empty list both mean no validation
    return move_keys(tree, problems, moved, moved_table(root))


def _drop_off_lora(tree: dict[str, Any], path: str) -> None:
    *parents, leaf = path.split(".")
    node: Any = tree
    for part in parents:
        node = node.get(part) if isinstance(node, dict) else None
    if not isinstance(node, dict) or not isinstance(node.get(leaf), dict):
        return
    rank = node[leaf].get("rank", node.get("lora_rank"))  # no rank in the section: the model's lora_rank
    if rank in (None, 0):
        node.pop(leaf)
        logger.warning(
            "ignored: %s (its rank is %s, so none of its settings is used; LoRA follows %s.lora_rank)",
            path,
            rank,
            ".".join(parents),
        )


def _staleness_in_versions(tree: dict[str, Any]) -> None:
    """verl's fractional ``async_training.staleness_threshold`` (extra samples as a share of one
    sync's worth) bounds staleness by ⌈fraction⌉ syncs; hybridflow's key counts syncs."""
    section = tree.get("async_training")
    if not isinstance(section, dict):
        return
    value = section.get("staleness_threshold")
    if isinstance(value, float) and not value.is_integer() and value > 0:
        section["staleness_threshold"] = math.ceil(value)
        logger.warning(
            "converted: async_training.staleness_threshold=%s is verl's fraction of extra samples; read as %d "
            "(hybridflow counts weight syncs: at most ⌈fraction⌉ syncs stale)",
            value,
            math.ceil(value),
        )


VERL_COMMIT = "b178a3c"  # the verl snapshot the key lists under tests/config/fixtures/verl/ come from
VERL_COMMIT_DATE = "2026-01-29"

# stem → (path in verl's repository, the config root it is loaded as)
VERL_CONFIG_FILES: dict[str, tuple[str, type]] = {
    "_generated_ppo_trainer": ("verl/trainer/config/_generated_ppo_trainer.yaml", PPOConfig),
    "_generated_ppo_megatron_trainer": ("verl/trainer/config/_generated_ppo_megatron_trainer.yaml", PPOConfig),
    "sft_trainer": ("verl/trainer/config/sft_trainer.yaml", SFTConfig),
    "sft_trainer_engine": ("verl/trainer/config/sft_trainer_engine.yaml", SFTConfig),
    "fully_async_ppo_trainer": (
        "verl/experimental/fully_async_policy/config/fully_async_ppo_trainer.yaml",
        PPOConfig,
    ),
    "one_step_off_ppo_trainer": (
        "verl/experimental/one_step_off_policy/config/one_step_off_ppo_trainer.yaml",
        PPOConfig,
    ),
}


def leaf_keys(tree: Any, prefix: str = "") -> list[str]:
    """Every dotted leaf key of a YAML tree in file order (a list, a scalar or ``{}`` is one leaf)."""
    if not isinstance(tree, dict) or (not tree and prefix):
        return [prefix]
    return [
        key
        for name, value in tree.items()
        for key in leaf_keys(value, f"{prefix}{name}" if not prefix else f"{prefix}.{name}")
    ]
