"""Loading the reward-model trainer's config, its derived defaults and its cross-key rules.

:func:`load_rm_config` = :func:`~hybridflow.config.loader.load_structured` on :class:`RMConfig`
followed by :func:`finalize_rm_config`, which (as for SFT) collects every problem before
raising: per-key checks, then derived defaults, then the cross-key rules (:data:`RM_RULES`).
"""

from __future__ import annotations

from collections.abc import Callable

from hybridflow.config.build import finalize_config
from hybridflow.config.loader import load_structured
from hybridflow.config.rm import RMConfig
from hybridflow.config.sft_rules import (
    process_count_problems,
    resolve_seed_and_run_dir,
    rule_optim,
    rule_trainer,
)


def load_rm_config(config_files: list[str] | None = None, overrides: list[str] | None = None) -> RMConfig:
    """The RM trainer's config: defaults ← ``config_files`` (in order) ← ``overrides`` (in order).

    Same override syntax as the other trainers (``data.max_length=256``, ``model.lora_rank=8``);
    raises :class:`ConfigError` naming each bad key and why.
    """
    cfg = load_structured(RMConfig, config_files, list(overrides or []))
    return finalize_rm_config(cfg)


def finalize_rm_config(cfg: RMConfig) -> RMConfig:
    """Check ``cfg``, fill in derived defaults, check cross-key rules; raise :class:`ConfigError`."""
    return finalize_config(cfg, resolve_rm_config, RM_RULES)


def resolve_rm_config(cfg: RMConfig) -> RMConfig:
    """Fill ``data.seed`` (= trainer.seed) and the checkpoint root (checkpoints/{project}/{experiment})."""
    return resolve_seed_and_run_dir(cfg)


# --- cross-key rules (each takes a resolved config, returns problems) -------------------------


def rule_processes(cfg: RMConfig) -> list[str]:
    return process_count_problems(cfg.trainer, cfg.data.train_batch_size, "rm", "the reward-model trainer")


def rule_data(cfg: RMConfig) -> list[str]:
    data = cfg.data
    problems = []
    if not data.train_files:
        problems.append("data.train_files must name at least one file")
    keys = {
        "data.prompt_key": data.prompt_key,
        "data.chosen_key": data.chosen_key,
        "data.rejected_key": data.rejected_key,
    }
    problems += [f"{key} must name a column" for key, value in keys.items() if not value]
    if data.chosen_key and data.chosen_key == data.rejected_key:
        problems.append(
            f"data.chosen_key and data.rejected_key are both {data.chosen_key!r}: they must name two columns"
        )
    return problems


def rule_no_packing(cfg: RMConfig) -> list[str]:
    if cfg.model.use_remove_padding:
        return [
            "model.use_remove_padding=true: packed rows are implemented for the RL trainer's actor, reference "
            "and critic passes and for `hybridflow sft`, not for reward models (a pair's score is read at each "
            "row's last token of the padded layout); set it to false"
        ]
    return []


RM_RULES: tuple[Callable[[RMConfig], list[str]], ...] = (
    rule_no_packing,
    rule_processes,
    rule_data,
    rule_optim,
    rule_trainer,
)
