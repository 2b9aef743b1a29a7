"""Loading the SFT config, its derived defaults and its cross-key rules.

:func:`load_sft_config` = :func:`~hybridflow.config.loader.load_structured` on :class:`SFTConfig`
followed by :func:`finalize_sft_config`, which (like the PPO one) collects every problem before
raising, so a user sees all mistakes at once:

1. per-key checks: types and declared bounds;
2. :func:`resolve_sft_config`: every ``None`` documented as "= <other key>" gets its value;
3. cross-key rules (:data:`SFT_RULES`).

The reward-model trainer's rules (``rm_rules.py``) reuse that sequence (:func:`finalize_config`),
the seed and run-folder defaults and the process-count rule, so both trainers read them alike.

Processes: ``torchrun --nproc_per_node=N -m hybridflow.entrypoints.sft ...`` starts N
data-parallel ranks, and the world size is torchrun's (``WORLD_SIZE``); ``trainer.nnodes ×
trainer.n_gpus_per_node`` must then be 1 (the default: "take torchrun's count") or equal it, so
a config written for another size is not run silently on this one. Without torchrun,
``trainer.n_gpus_per_node=N`` starts N ranks as Ray actors on this machine
(``hybridflow.trainer.supervised.ray_launch``); several machines need torchrun.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
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
    """Fill ``data.seed`` (= trainer.seed), ``model.strategy`` and the checkpoint root.

    ``model.strategy=auto`` is ``torch`` in one plain process and ``fsdp`` with several ranks
    or under torchrun (even with one rank: a torchrun run's checkpoints are then always sharded
    and resume into any number of ranks)."""
    cfg = resolve_seed_and_run_dir(cfg)
    several = cfg.trainer.nnodes * cfg.trainer.n_gpus_per_node > 1
    auto = "fsdp" if several or torchrun_world_size() is not None else "torch"
    strategy = auto if cfg.model.strategy == "auto" else cfg.model.strategy
    return replace(cfg, model=replace(cfg.model, strategy=strategy))


# what torchrun (torch.distributed.run) sets in every process it starts
TORCHRUN_VARS: tuple[str, ...] = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


def torchrun_world_size(environ: Mapping[str, str] | None = None) -> int | None:
    """``WORLD_SIZE`` when this process was started by torchrun (all of :data:`TORCHRUN_VARS`
    set), None otherwise. A malformed value is an error naming it."""
    env = os.environ if environ is None else environ
    if not all(name in env for name in TORCHRUN_VARS):
        return None
    try:
        return int(env["WORLD_SIZE"])
    except ValueError:
        raise ValueError(f"WORLD_SIZE={env['WORLD_SIZE']!r} (set by torchrun) is not a whole number") from None


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


def rule_processes(cfg: SFTConfig) -> list[str]:
    problems = process_count_problems(cfg.trainer, cfg.data.train_batch_size, "sft", "the SFT trainer")
    world = torchrun_world_size()
    ranks = cfg.trainer.nnodes * cfg.trainer.n_gpus_per_node if world is None else world
    if ranks > 1 and cfg.model.strategy == "torch":
        problems.append(
            f"model.strategy=torch trains in one process, but {ranks} were asked for; use model.strategy=auto (or fsdp)"
        )
    if world is None and ranks == 1 and cfg.model.strategy == "fsdp":
        problems.append(
            "model.strategy=fsdp needs a torch.distributed group: launch with "
            "`torchrun --nproc_per_node=N -m hybridflow.entrypoints.sft ...` (N = 1 works too)"
        )
    return problems


def process_count_problems(trainer: SFTTrainerConfig, train_batch_size: int, command: str, who: str) -> list[str]:
    """Problems with the number of processes (see the module docstring): ``trainer.nnodes ×
    trainer.n_gpus_per_node`` against torchrun's world size (or, without torchrun, what the Ray
    launcher can start: one machine), and ``train_batch_size`` (rows per optimizer step over all
    ranks) against it. ``command`` is the entry point's module name, ``who`` names the trainer."""
    asked = trainer.nnodes * trainer.n_gpus_per_node
    counts = f"trainer.nnodes × trainer.n_gpus_per_node = {trainer.nnodes} × {trainer.n_gpus_per_node}"
    world = torchrun_world_size()
    problems = []
    if world is None and trainer.nnodes > 1:
        problems.append(
            f"{counts}: {who} runs in one process, or in n_gpus_per_node Ray processes on this machine; "
            f"for several machines start it with torchrun on each: `torchrun --nnodes={trainer.nnodes} "
            f"--nproc_per_node={trainer.n_gpus_per_node} --rdzv-endpoint=HEAD:29500 -m hybridflow.entrypoints.{command} ...`"
        )
    if world is not None and asked not in (1, world):
        problems.append(
            f"{counts} = {asked}, but torchrun started {world} processes (WORLD_SIZE={world}); "
            "set them to match, or leave both at 1 to take torchrun's count"
        )
    ranks = asked if world is None else world
    if train_batch_size % ranks:
        problems.append(
            f"data.train_batch_size={train_batch_size} does not split evenly over {ranks} processes: "
            "each rank trains on train_batch_size / (number of processes) rows of every batch"
        )
    return problems


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


SFT_RULES: tuple[Callable[[SFTConfig], list[str]], ...] = (
    rule_processes,
    rule_token_budget,
    rule_data,
    rule_optim,
    rule_trainer,
)
