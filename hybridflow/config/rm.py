"""The reward-model trainer's config (``hybridflow rm``): ``data``, ``model``, ``optim``, ``trainer``.

The model, optimizer and trainer sections extend the SFT trainer's, so a key means the same
thing in both (``optim.lr``, ``model.lora_rank``, ``trainer.save_freq``, ...); the data section
is its own: pairs of replies instead of one. ``None`` defaults documented as "= <other key>"
are filled in once at load time (:func:`hybridflow.config.rm_rules.finalize_rm_config`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from hybridflow.config.actor_rollout_ref import ModelConfig
from hybridflow.config.sft import SFTOptimConfig, SFTTrainerConfig
from hybridflow.config.spec import section, setting


@dataclass(frozen=True)
class RMDataConfig:
    """``data``: preference-pair files, their columns, lengths and batch sizes."""

    train_files: tuple[str, ...] = setting(
        factory=lambda: ("~/data/hybridflow/arithmetic-pairs/train.parquet",),
        help="training parquet/jsonl file(s) of prompt/chosen/rejected rows; the default is the built-in "
        "arithmetic pairs (`hybridflow data arithmetic-pairs --out ~/data/hybridflow/arithmetic-pairs`)",
    )
    val_files: tuple[str, ...] = setting(
        factory=lambda: ("~/data/hybridflow/arithmetic-pairs/test.parquet",),
        help="validation parquet/jsonl file(s) for val/loss, val/accuracy, val/margin; empty = no validation",
    )
    prompt_key: str = setting("prompt", "column holding the prompt: chat messages or a string (one user message)")
    chosen_key: str = setting(
        "chosen", "column holding the preferred reply: a string, or messages ending with the assistant turn"
    )
    rejected_key: str = setting("rejected", "column holding the dispreferred reply (same forms as chosen_key)")
    max_length: int = setting(512, "tokens of prompt + reply after the chat template, per side", ge=2)
    truncation: Literal["error", "left"] = setting(
        "error", "a side longer than max_length: error, or keep its last tokens (left: the prompt's start is cut)"
    )
    train_batch_size: int = setting(16, "pairs per optimizer step", ge=1)
    micro_batch_size_per_gpu: int = setting(
        4,
        "pairs per forward/backward pass (2 sequences each; gradient accumulation); also the validation batch size",
        ge=1,
    )
    shuffle: bool = setting(True, "shuffle the training pairs each epoch")
    seed: int | None = setting(None, "shuffling seed; null = trainer.seed")


@dataclass(frozen=True)
class RMModelConfig(ModelConfig):
    """``model``: where the reward model starts and how it is trained (full or LoRA)."""

    path: str = setting(
        "smollm2-135m-instruct",
        "a causal LM folder, known name or Hub id `org/name[@revision]` (its decoder gets a new 1-output head, seeded by trainer.seed), or a "
        "reward-model folder (a *ForSequenceClassification, e.g. an earlier global_step_N/hf) to train further",
    )
    use_remove_padding: bool = setting(
        False, "packed rows are not implemented for reward-model training (they are for SFT): must stay false"
    )


@dataclass(frozen=True)
class RMOptimConfig(SFTOptimConfig):
    """``optim``: AdamW with the SFT trainer's defaults but a higher learning rate: the fresh head
    starts at r ≈ 0, and 1e-4 took SmolLM2-135M's arithmetic-pairs accuracy further in one epoch than 3e-5."""

    lr: float = setting(1e-4, "peak learning rate", gt=0)


@dataclass(frozen=True)
class RMTrainerConfig(SFTTrainerConfig):
    """``trainer``: the loop, logging, validation and checkpoints."""

    experiment_name: str = setting("rm", "run name (logging, checkpoint folder)")
    nnodes: int = setting(1, "machines: nnodes × n_gpus_per_node must be 1, or under torchrun 1 or WORLD_SIZE", ge=1)
    n_gpus_per_node: int = setting(
        1, "processes per machine: nnodes × n_gpus_per_node must be 1, or under torchrun 1 or WORLD_SIZE", ge=1
    )
    test_freq: int = setting(
        -1,
        "val/loss, val/accuracy, val/margin every N steps, and always after the last; ≤ 0 = only after the last",
        ge=-1,
    )
    val_before_train: bool = setting(True, "validate before the first step (logged at step 0)")
    export_hf: bool = setting(
        True, "also write global_step_N/hf: the reward model as a Hugging Face folder (LoRA merged)"
    )


@dataclass(frozen=True)
class RMConfig:
    """Root config of the reward-model trainer (``python -m hybridflow.entrypoints.rm``, ``hybridflow rm``)."""

    data: RMDataConfig = section(RMDataConfig, "preference pairs, lengths and batch sizes")
    model: RMModelConfig = section(RMModelConfig, "model to train (a causal LM gets a new head; full or LoRA)")
    optim: RMOptimConfig = section(RMOptimConfig, "optimizer and learning-rate schedule")
    trainer: RMTrainerConfig = section(RMTrainerConfig, "loop, logging, validation, checkpoints")
