"""Loading the SFT config, its derived defaults and its cross-key rules.

:func:`load_sft_config` = :func:`~hybridflow.config.loader.load_structured` on :class:`SFTConfig`
followed by :func:`finalize_sft_config`, which (like the PPO one) collects every problem before
raising, so a user sees all mistakes at once:

1. per-key checks: types and declared bounds;
2. :func:`resolve_sft_config`: every ``None`` documented as "= <other key>" gets its value;
3. cross-key rules (:data:`SFT_RULES`).

The reward-model trainer's rules (``rm_rules.py``) reuse that sequence (:func:`finalize_config`),
the seed and run-folder defaults and the single-process rule, so both trainers read them alike.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any, Protocol

from hybridflow.config.build import finalize_config
from hybridflow.config.loader import load_structured
from hybridflow.config.sft import SFTConfig, SFTOptimConfig, SFTTrainerConfig


def load_sft_config(config_files: list[str] | None = None, overrides: list[str] | None = None) -> SFTConfig:
    """The SFT trainer's config: defaults ← ``config_files`` (in order) ← ``overrides`` (in order).

    Same override syntax as the PPO trainer (``data.max_length=512``, ``model.lora_rank=8``);
    raises :class:`ConfigError` naming each bad key and why.
    """
    cfg = load_structured(SFTConfig, config_files, list(overrides or []))
    return finalize_sft_config(cfg)


def finalize_sft_config(cfg: SFTConfig) -> SFTConfig:
    """Check ``cfg``, fill in derived defaults, check cross-key rules; raise :class:`ConfigError`."""
    return finalize_config(cfg, resolve_sft_config, SFT_RULES)


def resolve_sft_config(cfg: SFTConfig) -> SFTConfig:
    """Fill ``data.seed`` (= trainer.seed), ``model.strategy`` (auto = torch) and the checkpoint root."""
    cfg = resolve_seed_and_run_dir(cfg)
    strategy = "torch" if cfg.model.strategy == "auto" else cfg.model.strategy
    return replace(cfg, model=replace(cfg.model, strategy=strategy))


def resolve_seed_and_run_dir(cfg: Any) -> Any:
    """``cfg`` (a config with ``data.seed`` and an SFT-style ``trainer``) with ``data.seed``
    (= trainer.seed) and ``trainer.default_local_dir`` (= checkpoints/{project}/{experiment}) filled."""
    trainer = cfg.trainer
    default_dir = f"checkpoints/{trainer.project_name}/{trainer.experiment_name}"
    return replace(
        cfg,
        data=replace(cfg.data, seed=trainer.seed if cfg.data.seed is None else cfg.data.seed),
        trainer=replace(trainer, default_local_dir=trainer.default_local_dir or default_dir),
    )


# --- cross-key rules (each takes a resolved config, returns problems) -------------------------


def rule_single_process(cfg: SFTConfig) -> list[str]:
    return single_process_problems(cfg.trainer, "the SFT trainer")


def single_process_problems(trainer: SFTTrainerConfig, who: str) -> list[str]:
    """A problem unless ``trainer`` asks for exactly one process (``who`` names the trainer)."""
    if trainer.nnodes * trainer.n_gpus_per_node != 1:
        return [
            f"trainer.nnodes × trainer.n_gpus_per_node = {trainer.nnodes} × {trainer.n_gpus_per_node}: "
            f"{who} runs in one process; set both to 1"
        ]
    return []


def rule_token_budget(cfg: SFTConfig) -> list[str]:
    data = cfg.data
    if data.use_dynamic_bsz and data.max_token_len_per_gpu < data.max_length:
        return [
            f"data.max_token_len_per_gpu={data.max_token_len_per_gpu} is below data.max_length={data.max_length}: "
            "a full-length example would not fit in one micro-batch"
        ]
    return []


def rule_data(cfg: SFTConfig) -> list[str]:
    data = cfg.data
    problems = []
    if not data.train_files:
        problems.append("data.train_files must name at least one file")
    if data.multiturn.enable and not data.multiturn.messages_key:
        problems.append("data.multiturn.messages_key must name a column when data.multiturn.enable=true")
    if not data.multiturn.enable and not (data.prompt_key and data.response_key):
        problems.append("data.prompt_key and data.response_key must name columns (or set data.multiturn.enable=true)")
    return problems


class _WithOptim(Protocol):
    """A root config with an SFT-style optim section (SFTConfig, RMConfig)."""

    @property
    def optim(self) -> SFTOptimConfig: ...


class _WithTrainer(Protocol):
    """A root config with an SFT-style trainer section (SFTConfig, RMConfig)."""

    @property
    def trainer(self) -> SFTTrainerConfig: ...


def rule_optim(cfg: _WithOptim) -> list[str]:
    betas = cfg.optim.betas
    if len(betas) != 2 or not all(0 <= b < 1 for b in betas):
        return [f"optim.betas must be two numbers in [0, 1), got {list(betas)}"]
    return []


def rule_trainer(cfg: _WithTrainer) -> list[str]:
    if cfg.trainer.resume_mode == "resume_path" and not cfg.trainer.resume_from_path:
        return ["trainer.resume_from_path must be set when trainer.resume_mode=resume_path"]
    return []


def rule_no_packing(cfg: SFTConfig) -> list[str]:
    if cfg.model.use_remove_padding:
        return [
            "model.use_remove_padding=true: packed rows are implemented for the RL trainer's actor, reference "
            "and critic passes, not for SFT yet; set it to false"
        ]
    return []


SFT_RULES: tuple[Callable[[SFTConfig], list[str]], ...] = (
    rule_no_packing,
    rule_single_process,
    rule_token_budget,
    rule_data,
    rule_optim,
    rule_trainer,
)
