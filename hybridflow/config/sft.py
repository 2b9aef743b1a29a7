"""The SFT trainer's config: ``data``, ``model``, ``optim``, ``trainer`` and the root :class:`SFTConfig`.

Keys and defaults follow verl's ``sft_trainer.yaml`` where verl has them (``data.prompt_key``,
``data.response_key``, ``data.multiturn.*``, ``data.max_length``, ``data.truncation``,
``data.micro_batch_size_per_gpu``, ``optim.clip_grad``, ``trainer.max_ckpt_to_keep``, ...);
verl's ``model.partial_pretrain`` is read as ``model.path``. The model and optimizer sections
extend the PPO trainer's :class:`ModelConfig` / :class:`OptimConfig`, so a key means the same
thing in both trainers. ``None`` defaults documented as "= <other key>" are filled in once at
load time (:func:`hybridflow.config.sft_rules.finalize_sft_config`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from hybridflow.config.actor_rollout_ref import ModelConfig, OptimConfig
from hybridflow.config.spec import section, setting


@dataclass(frozen=True)
class SFTMultiTurnConfig:
    """``data.multiturn``: whole conversations instead of prompt/response pairs."""

    enable: bool = setting(False, "read conversations from messages_key; the loss covers every assistant turn")
    messages_key: str = setting("messages", "column holding the list of {role, content} chat messages")
    tools_key: str | None = setting(
        "tools",
        "column holding a row's tool schemas (OpenAI function schemas; absent or null = no tools); null = never read",
    )
    format: str = setting(
        "hermes",
        "tool-call format used to describe the tools in the system message when the chat template "
        "ignores tools (as actor_rollout_ref.rollout.multi_turn.format)",
    )


@dataclass(frozen=True)
class SFTDataConfig:
    """``data``: example files, templating, length limits and batch sizes."""

    train_files: tuple[str, ...] = setting(
        factory=lambda: ("~/data/hybridflow/arithmetic-sft/train.parquet",),
        help="training parquet/jsonl file(s); the default is the built-in arithmetic task with worked answers "
        "(`hybridflow data arithmetic-sft --out ~/data/hybridflow/arithmetic-sft`)",
    )
    val_files: tuple[str, ...] = setting(
        factory=lambda: ("~/data/hybridflow/arithmetic-sft/test.parquet",),
        help="validation parquet/jsonl file(s) for the validation loss; empty = no validation",
    )
    prompt_key: str = setting("prompt", "column holding the prompt: a string (one user message) or chat messages")
    response_key: str = setting("response", "column holding the response text (the assistant's reply)")
    multiturn: SFTMultiTurnConfig = section(SFTMultiTurnConfig, "multi-turn conversations")
    max_length: int = setting(1024, "tokens per example after the chat template (prompt + response)", ge=2)
    truncation: Literal["error", "left", "right"] = setting(
        "error", "an example longer than max_length: error, or keep its last (left) / first (right) tokens"
    )
    train_batch_size: int = setting(16, "examples per optimizer step", ge=1)
    micro_batch_size_per_gpu: int = setting(
        4, "examples per forward/backward pass (gradient accumulation); also the validation batch size", ge=1
    )
    use_dynamic_bsz: bool = setting(False, "form micro-batches by token budget instead of by count")
    max_token_len_per_gpu: int = setting(
        4096,
        "token budget of one micro-batch per rank when use_dynamic_bsz: rows × longest row, or the real tokens "
        "with model.use_remove_padding (must be ≥ max_length)",
        ge=1,
    )
    shuffle: bool = setting(True, "shuffle the training set each epoch")
    seed: int | None = setting(None, "shuffling seed; null = trainer.seed")
    apply_chat_template_kwargs: dict[str, Any] = setting(
        factory=dict, help="extra keyword arguments for tokenizer.apply_chat_template"
    )


@dataclass(frozen=True)
class SFTModelConfig(ModelConfig):
    """``model``: the model to fine-tune (verl's ``model.partial_pretrain`` is read as ``path``)."""

    strategy: str = setting("auto", "training engine in the registry; auto = torch in one process, fsdp under torchrun")
    use_remove_padding: bool = setting(
        False,
        "pack each micro-batch's conversations into one row without padding (positions restart and attention "
        "stays inside each conversation); with data.use_dynamic_bsz the token budget counts real tokens",
    )


@dataclass(frozen=True)
class SFTOptimConfig(OptimConfig):
    """``optim``: AdamW with verl's SFT defaults (lr 1e-5, betas 0.9/0.95, 10% warm-up, cosine)."""

    lr: float = setting(1e-5, "peak learning rate", gt=0)
    betas: tuple[float, ...] = setting(factory=lambda: (0.9, 0.95), help="AdamW (beta1, beta2)")
    lr_warmup_steps_ratio: float = setting(0.1, "warm-up steps as a fraction of all training steps", ge=0, le=1)
    lr_scheduler_type: Literal["constant", "cosine"] = setting(
        "cosine", "LR after warm-up: constant, or cosine decay (verl's `lr_scheduler` / `warmup_style`)"
    )
    clip_grad: float = setting(1.0, "max global gradient norm", gt=0)


@dataclass(frozen=True)
class SFTTrainerConfig:
    """``trainer``: the loop, logging, validation and checkpoints."""

    total_epochs: int = setting(1, "passes over the training set", ge=1)
    total_training_steps: int | None = setting(None, "stop after this many steps; null = total_epochs × batches", ge=1)
    project_name: str = setting("hybridflow", "project name (logging, checkpoint folder)")
    experiment_name: str = setting("sft", "run name (logging, checkpoint folder)")
    logger: tuple[str, ...] = setting(
        factory=lambda: ("console",), help="tracking backends: console, jsonl, tensorboard, wandb"
    )
    seed: int = setting(1, "global seed (shuffling, any randomness in the model)")
    device: Literal["auto", "cpu", "cuda"] = setting("auto", "device: auto = cuda if available, else cpu")
    nnodes: int = setting(1, "machines: nnodes × n_gpus_per_node must be 1, or under torchrun 1 or WORLD_SIZE", ge=1)
    n_gpus_per_node: int = setting(
        1, "processes per machine: nnodes × n_gpus_per_node must be 1, or under torchrun 1 or WORLD_SIZE", ge=1
    )
    test_freq: int = setting(
        -1, "validation loss every N steps, and always after the last; ≤ 0 = only after the last", ge=-1
    )
    save_freq: int = setting(
        -1, "checkpoint every N steps, and always after the last; ≤ 0 = only after the last", ge=-1
    )
    export_hf: bool = setting(
        True, "also write global_step_N/hf: a Hugging Face model folder (LoRA merged) usable as a model path"
    )
    resume_mode: Literal["auto", "disable", "resume_path"] = setting(
        "auto", "auto = newest checkpoint in default_local_dir, disable, or resume_path = resume_from_path"
    )
    resume_from_path: str | None = setting(None, "checkpoint folder (global_step_N) for resume_mode=resume_path")
    default_local_dir: str | None = setting(
        None, "checkpoint root and run folder; null = checkpoints/{project_name}/{experiment_name}"
    )
    max_ckpt_to_keep: int | None = setting(None, "keep only the newest N checkpoints; null = all", ge=1)


@dataclass(frozen=True)
class SFTConfig:
    """Root config of the SFT trainer (``python -m hybridflow.entrypoints.sft``, ``hybridflow sft``)."""

    data: SFTDataConfig = section(SFTDataConfig, "examples, templating, lengths and batch sizes")
    model: SFTModelConfig = section(SFTModelConfig, "model to fine-tune (full or LoRA)")
    optim: SFTOptimConfig = section(SFTOptimConfig, "optimizer and learning-rate schedule")
    trainer: SFTTrainerConfig = section(SFTTrainerConfig, "loop, logging, validation, checkpoints")
