"""``python -m hybridflow.entrypoints.rm [--config FILE] [key=value ...]`` (= ``hybridflow rm``).

Trains a Bradley–Terry reward model on prompt/chosen/rejected pairs (parquet or jsonl). The
model is a causal LM's decoder with a new 1-output head (``model.path``: a folder or a known
name), or an earlier reward model to train further; full fine-tuning or LoRA. With no
arguments it runs the embedded default: SmolLM2-135M-Instruct on the built-in arithmetic pairs,
on the CPU. Metrics go to the ``trainer.logger`` backends and to metrics.jsonl in the run
folder. Every checkpoint holds ``hf/``, a reward-model folder that
``hybridflow.models.reward_model.load_reward_model`` loads::

    hybridflow data arithmetic-pairs --out ~/data/hybridflow/arithmetic-pairs
    hybridflow rm trainer.total_training_steps=40 trainer.test_freq=10

Data-parallel ranks: ``torchrun --nproc_per_node=N -m hybridflow.entrypoints.rm ...`` (gloo on
the CPU, NCCL on GPUs; see docs/reward_models.md, "Many processes").
"""

from __future__ import annotations

import argparse
import copy
import sys
from typing import Any

import torch
from transformers import AutoConfig

from hybridflow.config import ConfigError
from hybridflow.config.rm import RMConfig
from hybridflow.config.rm_rules import load_rm_config
from hybridflow.config.sft_rules import torchrun_world_size
from hybridflow.data import StatefulDataLoader
from hybridflow.data.pair_dataset import PairDataset
from hybridflow.engine import MicroBatchSpec
from hybridflow.entrypoints.common import (
    build_datasets_validated,
    check_data_files,
    resolve_device,
)
from hybridflow.models import (
    ModelLoadError,
    choose_attn_implementation,
    resolve_model_path,
)
from hybridflow.models.loader import apply_lora, enable_gradient_checkpointing
from hybridflow.models.reward_model import load_reward_model, reward_model_from_lm
from hybridflow.trainer.supervised.base import build_tracking, fit_and_report
from hybridflow.trainer.supervised.ranks import (
    close_data_parallel,
    init_data_parallel,
    naming_the_rank,
    rank_label,
)
from hybridflow.trainer.supervised.ray_launch import launch_ranks_on_ray
from hybridflow.trainer.supervised.rm_trainer import RMTrainer
from hybridflow.utils.allocator import keep_freed_memory
from hybridflow.utils.errors import run_main
from hybridflow.workers.engine_factory import build_engine

PROG = "hybridflow rm"


def is_reward_model_folder(path: str, trust_remote_code: bool = False) -> bool:
    """True if ``path`` (a folder or known name) holds a *ForSequenceClassification model."""
    folder = resolve_model_path(path)
    try:
        config = AutoConfig.from_pretrained(folder, local_files_only=True, trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as err:
        raise ModelLoadError(f"model.path={path}: could not read the model config in {folder}: {err}") from err
    return any(a.endswith("ForSequenceClassification") for a in (getattr(config, "architectures", None) or []))


def load_rm_module(config: RMConfig, device: str | None = None) -> tuple[torch.nn.Module, Any]:
    """``(module, tokenizer)``: the reward model to train, parameters in fp32 (``model.dtype``
    sets the compute dtype, see build_engine), with LoRA adapters when ``model.lora_rank > 0``."""
    model_cfg = config.model
    attn = choose_attn_implementation(
        model_cfg.attn_implementation, device or resolve_device(config.trainer.device), config.data.max_length
    )
    common: dict[str, Any] = dict(dtype="fp32", trust_remote_code=model_cfg.trust_remote_code, attn_implementation=attn)
    if is_reward_model_folder(model_cfg.path, model_cfg.trust_remote_code):
        model, tokenizer = load_reward_model(model_cfg.path, **common)
    else:
        model, tokenizer = reward_model_from_lm(model_cfg.path, seed=config.trainer.seed, **common)
    if model_cfg.enable_gradient_checkpointing:
        enable_gradient_checkpointing(model)
    module: torch.nn.Module = model
    if model_cfg.lora_rank > 0:
        target = model_cfg.target_modules
        # SEQ_CLS keeps the head ("score") fully trainable next to the adapters
        module = apply_lora(
            model,
            model_cfg.lora_rank,
            model_cfg.lora_alpha,
            list(target) if isinstance(target, tuple) else target,
            task_type="SEQ_CLS",
        )
    if model_cfg.custom_chat_template is not None:
        tokenizer.chat_template = model_cfg.custom_chat_template
    return module, tokenizer


def build_rm_loaders(config: RMConfig, tokenizer: Any) -> tuple[StatefulDataLoader, StatefulDataLoader | None]:
    """Training loader (train_batch_size pairs, resumable) and validation loader (micro_batch_size_per_gpu)."""
    data = config.data
    columns: dict[str, Any] = dict(
        prompt_key=data.prompt_key,
        chosen_key=data.chosen_key,
        rejected_key=data.rejected_key,
        max_length=data.max_length,
        truncation=data.truncation,
    )
    files = {"data.train_files": tuple(data.train_files), "data.val_files": tuple(data.val_files)}
    # A bad file of the user's fails before a missing built-in task is written into ~/data.
    datasets = build_datasets_validated(
        {key: value for key, value in files.items() if value},
        lambda _, key_files: PairDataset(key_files, tokenizer, **columns),
    )
    seed = data.seed
    assert seed is not None  # = trainer.seed, filled when the config is loaded (resolve_seed_and_run_dir)
    train = datasets["data.train_files"]
    train_loader = StatefulDataLoader(train, data.train_batch_size, shuffle=data.shuffle, seed=seed)
    if not data.val_files:
        return train_loader, None
    val = datasets["data.val_files"]
    return train_loader, StatefulDataLoader(
        val, data.micro_batch_size_per_gpu, shuffle=False, seed=seed, drop_last=False
    )


def build_rm_trainer(config: RMConfig) -> RMTrainer:
    """Everything :class:`RMTrainer` needs, built from the config. Under torchrun this process
    joins the ranks' process group first and the FSDP engine shards the model; rank 0 keeps an
    unsharded CPU copy for the ``hf/`` export (none with ``trainer.export_hf=false``)."""
    ranks, device = init_data_parallel(resolve_device(config.trainer.device))
    torch.manual_seed(config.trainer.seed)
    data, trainer_cfg = config.data, config.trainer
    check_data_files({"data.train_files": tuple(data.train_files), "data.val_files": tuple(data.val_files)})
    module, tokenizer = load_rm_module(config, device)
    sharded = ranks.launched
    unsharded_copy = copy.deepcopy(module) if sharded and ranks.is_main and trainer_cfg.export_hf else None
    train_loader, val_loader = build_rm_loaders(config, tokenizer)
    total_steps = trainer_cfg.total_training_steps or len(train_loader) * trainer_cfg.total_epochs
    micro_batch = MicroBatchSpec(size=data.micro_batch_size_per_gpu)
    engine = build_engine(
        module,
        config.optim,
        strategy="fsdp" if sharded else "torch",
        grad_clip=config.optim.clip_grad,
        micro_batch=micro_batch,
        total_training_steps=total_steps,
        device=device,
        dtype=config.model.dtype,
        world_size=ranks.world_size,
        owner="model",
    )
    tracking = build_tracking(config, ranks)
    trainer = RMTrainer(
        config, engine, tokenizer, train_loader, val_loader, tracking, total_steps, micro_batch, ranks=ranks
    )
    trainer.unsharded_copy = unsharded_copy
    return trainer


def run(trainer: RMTrainer) -> dict[str, float]:
    """Fit; prints where the run folder and the last exported reward-model folder are."""
    return fit_and_report(trainer, lambda hf: f"reward model folder: {hf}  (load_reward_model({str(hf)!r}))")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--config", action="append", default=[], help="YAML config file (repeatable)")
    parser.add_argument("overrides", nargs="*", help="dotted overrides, e.g. data.max_length=256 model.lora_rank=8")
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parser.parse_args(argv)
    keep_freed_memory()
    prog = f"{PROG}{rank_label()}"
    try:
        config = load_rm_config(args.config, args.overrides)
    except ConfigError as exc:
        print(f"{prog}: invalid config:\n{exc}", file=sys.stderr)
        return 2
    processes = config.trainer.nnodes * config.trainer.n_gpus_per_node
    if processes > 1 and torchrun_world_size() is None:  # no torchrun: the ranks as Ray actors, each runs main
        use_gpu = resolve_device(config.trainer.device) == "cuda"
        return launch_ranks_on_ray(prog, "hybridflow.entrypoints.rm", argv, processes, use_gpu)

    def body() -> int:
        run(build_rm_trainer(config))
        close_data_parallel()
        return 0

    with naming_the_rank(PROG):
        return run_main(prog, body)


if __name__ == "__main__":
    sys.exit(main())
