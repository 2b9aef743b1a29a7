"""``python -m hybridflow.entrypoints.sft [--config FILE] [key=value ...]`` (= ``hybridflow sft``).

Parses the SFT config once, loads the model (full or LoRA), builds the datasets, loaders,
engine and tracking from it, and runs :meth:`SFTTrainer.fit`. With no arguments it runs the
embedded default: SmolLM2-135M-Instruct on the built-in arithmetic task with worked answers,
on the CPU. Every checkpoint holds ``hf/``, a Hugging Face model folder to start RL from::

    hybridflow sft trainer.experiment_name=sft_arith
    hybridflow train actor_rollout_ref.model.path=checkpoints/hybridflow/sft_arith/global_step_N/hf

Data-parallel ranks: ``torchrun --nproc_per_node=N -m hybridflow.entrypoints.sft ...`` (gloo on
the CPU, NCCL on GPUs; see docs/sft.md, "Many processes").
"""

from __future__ import annotations

import argparse
import sys
from functools import partial
from typing import Any

import torch

from hybridflow.agent.parsers import get_tool_parser
from hybridflow.agent.tool_agent import tool_prompt_messages
from hybridflow.config import ConfigError, SFTConfig, load_sft_config
from hybridflow.config.sft_rules import torchrun_world_size
from hybridflow.data import StatefulDataLoader
from hybridflow.data.sft_dataset import SFTDataset
from hybridflow.entrypoints.common import (
    build_datasets_validated,
    check_data_files,
    resolve_device,
)
from hybridflow.models import (
    ModelLoadError,
    choose_attn_implementation,
    load_model_and_tokenizer,
    resolve_model_path,
)
from hybridflow.models.packed_attention import packed_name
from hybridflow.models.processor import load_processor
from hybridflow.trainer.supervised.base import build_tracking, fit_and_report
from hybridflow.trainer.supervised.ranks import (
    close_data_parallel,
    init_data_parallel,
    naming_the_rank,
    rank_label,
)
from hybridflow.trainer.supervised.ray_launch import launch_ranks_on_ray
from hybridflow.trainer.supervised.sft_trainer import SFTTrainer
from hybridflow.utils.allocator import keep_freed_memory
from hybridflow.utils.errors import InputError, debug_enabled, one_paragraph
from hybridflow.workers.engine_factory import build_engine
from hybridflow.workers.ppo_loop import micro_batch_spec


def build_sft_loaders(
    config: SFTConfig, tokenizer, processor: Any = None
) -> tuple[StatefulDataLoader, StatefulDataLoader | None]:
    """Training loader (train_batch_size, resumable) and validation loader (micro_batch_size_per_gpu).
    ``processor``: the model folder's multimodal processor (conversations with images, verl's
    ``images`` column), None for a text-only model."""
    data = config.data
    if data.multiturn.enable:
        get_tool_parser(data.multiturn.format)  # an unknown format fails here, not at the first row with tools
    common: dict[str, Any] = dict(
        prompt_key=data.prompt_key,
        response_key=data.response_key,
        messages_key=data.multiturn.messages_key if data.multiturn.enable else None,
        tools_key=data.multiturn.tools_key,
        tool_prompt=partial(
            tool_prompt_messages,
            tokenizer,
            format=data.multiturn.format,
            chat_template_kwargs=dict(data.apply_chat_template_kwargs),
        ),
        max_length=data.max_length,
        truncation=data.truncation,
        chat_template_kwargs=dict(data.apply_chat_template_kwargs),
        processor=processor,
    )
    seed = config.trainer.seed if data.seed is None else data.seed
    files = {"data.train_files": tuple(data.train_files), "data.val_files": tuple(data.val_files)}
    # A bad file of the user's fails before a missing built-in task is written into ~/data.
    datasets = build_datasets_validated(
        {key: value for key, value in files.items() if value},
        lambda _, key_files: SFTDataset(key_files, tokenizer, **common),
    )
    train_loader = StatefulDataLoader(
        datasets["data.train_files"], data.train_batch_size, shuffle=data.shuffle, seed=seed
    )
    if not data.val_files:
        return train_loader, None
    val = datasets["data.val_files"]
    val_loader = StatefulDataLoader(val, data.micro_batch_size_per_gpu, shuffle=False, seed=seed, drop_last=False)
    return train_loader, val_loader


def sft_attn_implementation(config: SFTConfig, device: str | torch.device) -> str:
    """The HF attention kernel: ``model.attn_implementation`` for rows of ≤ ``data.max_length``
    tokens, as its packed variant when ``model.use_remove_padding`` (the SFT forward then packs
    every micro-batch into one row, :mod:`hybridflow.trainer.supervised.sft_loss`)."""
    base = choose_attn_implementation(config.model.attn_implementation, device, config.data.max_length)
    return packed_name(base) if config.model.use_remove_padding else base


def load_sft_model(config: SFTConfig, device: str | torch.device) -> tuple[torch.nn.Module, Any]:
    """The model (full or LoRA) and its tokenizer, with ``model.custom_chat_template`` applied.
    Parameters stay fp32: ``model.dtype=bf16`` trains under bf16 autocast (see build_engine)."""
    model_cfg = config.model
    target_modules = model_cfg.target_modules
    module, tokenizer = load_model_and_tokenizer(
        model_cfg.path,
        dtype="fp32",
        gradient_checkpointing=model_cfg.enable_gradient_checkpointing,
        lora_rank=model_cfg.lora_rank,
        lora_alpha=model_cfg.lora_alpha,
        target_modules=list(target_modules) if isinstance(target_modules, tuple) else target_modules,
        trust_remote_code=model_cfg.trust_remote_code,
        attn_implementation=sft_attn_implementation(config, device),
    )
    if model_cfg.custom_chat_template is not None:
        tokenizer.chat_template = model_cfg.custom_chat_template
    return module, tokenizer


def build_sft_trainer(config: SFTConfig) -> SFTTrainer:
    """Everything :class:`SFTTrainer` needs, built from the config. Under torchrun this process
    joins the ranks' process group first (every rank builds the same model from the same seed)."""
    ranks, device = init_data_parallel(resolve_device(config.trainer.device))
    torch.manual_seed(config.trainer.seed)
    model_cfg, data = config.model, config.data
    check_data_files({"data.train_files": tuple(data.train_files), "data.val_files": tuple(data.val_files)})
    module, tokenizer = load_sft_model(config, device)
    processor = load_processor(resolve_model_path(model_cfg.path))
    train_loader, val_loader = build_sft_loaders(config, tokenizer, processor)
    total_steps = config.trainer.total_training_steps or len(train_loader) * config.trainer.total_epochs
    # packed rows: the token budget counts real tokens, as the actor's does
    micro_batch = micro_batch_spec(
        data.use_dynamic_bsz, data.micro_batch_size_per_gpu, data.max_token_len_per_gpu, model_cfg.use_remove_padding
    )
    engine = build_engine(
        module,
        config.optim,
        strategy=model_cfg.strategy,
        grad_clip=config.optim.clip_grad,
        micro_batch=micro_batch,
        total_training_steps=total_steps,
        device=device,
        dtype=model_cfg.dtype,
        world_size=ranks.world_size,
        owner="model",
    )
    tracking = build_tracking(config, ranks)
    return SFTTrainer(
        config,
        engine,
        tokenizer,
        train_loader,
        val_loader,
        tracking,
        total_steps,
        micro_batch,
        ranks=ranks,
        processor=processor,
    )


def run(trainer: SFTTrainer) -> dict[str, float]:
    """Fit; prints where the run folder and the last HF model folder are."""
    return fit_and_report(
        trainer, lambda hf: f"Hugging Face model folder: {hf}  (e.g. actor_rollout_ref.model.path={hf})"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="hybridflow sft", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--config", action="append", default=[], help="YAML config file (repeatable)")
    parser.add_argument("overrides", nargs="*", help="dotted overrides, e.g. data.max_length=512 model.lora_rank=8")
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parser.parse_args(argv)
    keep_freed_memory()
    prog = f"hybridflow sft{rank_label()}"
    try:
        config = load_sft_config(args.config, args.overrides)
    except ConfigError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 2
    processes = config.trainer.nnodes * config.trainer.n_gpus_per_node
    if processes > 1 and torchrun_world_size() is None:  # no torchrun: the ranks as Ray actors, each runs main
        use_gpu = resolve_device(config.trainer.device) == "cuda"
        return launch_ranks_on_ray(prog, "hybridflow.entrypoints.sft", argv, processes, use_gpu)
    with naming_the_rank("hybridflow sft"):
        try:
            trainer = build_sft_trainer(config)
        except (ValueError, ModelLoadError, FileNotFoundError) as exc:  # bad data, sizes or model path
            print(f"{prog}: error: {exc}", file=sys.stderr)
            return 2
        try:
            run(trainer)
        except InputError as exc:  # a damaged or refused checkpoint file, a model whose logits are NaN, ...
            if debug_enabled():
                raise
            print(f"{prog}: error: {one_paragraph(exc)}", file=sys.stderr)
            return 2
    close_data_parallel()
    return 0


if __name__ == "__main__":
    sys.exit(main())
