"""Read a training checkpoint back into the trained module (the first half of verl's model merger).

Input: an actor checkpoint as the trainer writes it (any of these paths)::

    {default_local_dir}/                     → the step in latest_checkpointed_iteration.txt
    {default_local_dir}/global_step_N/       → its actor/
    {default_local_dir}/global_step_N/actor/ model.safetensors (+ optimizer.pt, extra_state.pt)
                                             tokenizer/   hf_config/ (config.json,
                                             generation_config.json, adapter_config.json if LoRA)

The weights are read by a checkpoint reader picked from ``CHECKPOINT_READERS`` (detected from
the folder, or named with ``backend``). A reader returns the full state dict under the training
module's names: the single-process ``torch`` engine's one ``model.safetensors``, or the ``fsdp``
engine's per-rank DCP shards (``model/__r_0.distcp`` + ``fsdp_meta.json``) reassembled into the
same full state dict. A checkpoint whose files do not match the checksums recorded when it was
saved is refused.

The module is rebuilt from the checkpoint's HF config and loaded with those weights; a LoRA
checkpoint comes back as a ``PeftModel``, which :func:`merged_model` turns into a plain model
(``W + (α/r)·B·A`` folded into the base weights). Writing the result as a Hugging Face folder is
:mod:`hybridflow.export.writer`'s job.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file
from transformers import AutoConfig, GenerationConfig

from hybridflow.engine.checkpoint import MODEL_FILE
from hybridflow.engine.fsdp_checkpoint import is_fsdp_checkpoint, read_full_model_state
from hybridflow.models.hf_metadata import (
    ADAPTER_CONFIG_FILE,
    CONFIG_FILE,
    GENERATION_CONFIG_FILE,
    HF_CONFIG_DIR,
)
from hybridflow.models.loader import causal_lm_auto_class, is_vision_language_config
from hybridflow.trainer import checkpoint as ckpt
from hybridflow.trainer.checkpoint import LATEST_FILE
from hybridflow.utils.errors import InputError
from hybridflow.utils.registry import Registry

TOKENIZER_DIR = "tokenizer"  # the actor writes its tokenizer here, next to the weights
ACTOR_DIR = "actor"
_LORA_MARK = ".lora_"

logger = logging.getLogger("hybridflow.export")


class CheckpointError(InputError, ValueError):
    """A checkpoint is missing, corrupt, or lacks what the export needs; the message says which."""


# --- readers -------------------------------------------------------------------------------

CheckpointReader = Callable[[Path], dict[str, torch.Tensor]]


@dataclass(frozen=True)
class ReaderSpec:
    """How to recognise a reader's checkpoint folder, and a one-line description."""

    detect: Callable[[Path], bool]
    description: str


CHECKPOINT_READERS: Registry[CheckpointReader] = Registry("checkpoint reader")


def _is_torch_checkpoint(path: Path) -> bool:
    return (path / MODEL_FILE).is_file()


@CHECKPOINT_READERS.register(
    "torch", meta=ReaderSpec(_is_torch_checkpoint, "single-process engine: one model.safetensors")
)
def read_torch_checkpoint(path: Path) -> dict[str, torch.Tensor]:
    """The state dict in ``path/model.safetensors`` (tied tensors stored once, under one name)."""
    file = path / MODEL_FILE
    if not file.is_file():
        raise CheckpointError(f"{path}: no {MODEL_FILE} (found: {_listing(path)})")
    try:
        return load_file(str(file))
    except (SafetensorError, OSError) as err:
        raise CheckpointError(
            f"{file}: not a readable safetensors file ({err}); the checkpoint is corrupt or truncated"
        ) from err


@CHECKPOINT_READERS.register(
    "fsdp", meta=ReaderSpec(is_fsdp_checkpoint, "FSDP engine: per-rank model/__r_0.distcp shards + fsdp_meta.json")
)
def read_fsdp_checkpoint(path: Path) -> dict[str, torch.Tensor]:
    """The full state dict reassembled from every rank's shard (no process group needed)."""
    try:
        return read_full_model_state(path)
    except (OSError, ValueError, RuntimeError) as err:  # DCP raises these for missing or corrupt shards
        raise CheckpointError(f"{path}: cannot reassemble the FSDP shards: {type(err).__name__}: {err}") from err


def detect_backend(path: Path) -> str:
    """The first registered reader whose ``detect`` accepts ``path``; a clear error otherwise."""
    for name in CHECKPOINT_READERS.names():
        if CHECKPOINT_READERS.meta(name).detect(path):
            return name
    readers = "; ".join(f"{n}: {CHECKPOINT_READERS.meta(n).description}" for n in CHECKPOINT_READERS.names())
    if any(path.glob("rank_*")):
        raise CheckpointError(
            f"{path} holds per-rank shards (rank_*/) but no registered reader recognises them; readers: {readers}"
        )
    raise CheckpointError(f"{path} is not an engine checkpoint folder (found: {_listing(path)}); readers: {readers}")


def _listing(path: Path) -> str:
    if not path.is_dir():
        return "the folder does not exist"
    names = sorted(p.name + ("/" if p.is_dir() else "") for p in path.iterdir())
    return ", ".join(names) or "nothing"


# --- locating the parts of a checkpoint ----------------------------------------------------


@dataclass(frozen=True)
class CheckpointSource:
    """Where each part of one checkpoint is: weights (read by ``backend``), HF config, tokenizer."""

    weights_dir: Path
    backend: str
    hf_config_dir: Path
    tokenizer_dir: Path | None

    @property
    def is_lora(self) -> bool:
        return (self.hf_config_dir / ADAPTER_CONFIG_FILE).is_file()


def resolve_weights_dir(path: str | os.PathLike) -> Path:
    """A run folder → its latest step's ``actor/``; a ``global_step_N`` folder → its ``actor/``."""
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"checkpoint path {path} does not exist")
    latest = path / LATEST_FILE
    if latest.is_file():
        step = latest.read_text().strip()
        if not step.isdigit():
            raise CheckpointError(f"{latest} is corrupt: expected a step number, found {step!r}")
        path = path / f"global_step_{step}"
    if (path / ACTOR_DIR).is_dir():
        path = path / ACTOR_DIR
    return path


def locate_checkpoint(
    path: str | os.PathLike, hf_model_config_path: str | os.PathLike | None = None, backend: str = "auto"
) -> CheckpointSource:
    """The parts of the checkpoint at ``path``.

    The HF config comes from the checkpoint's ``hf_config/``; ``hf_model_config_path`` (the
    base model folder used for training) stands in for it in checkpoints written without one,
    and for a missing ``tokenizer/``.
    """
    weights_dir = resolve_weights_dir(path)
    verify_source(weights_dir)
    name = detect_backend(weights_dir) if backend == "auto" else backend
    CHECKPOINT_READERS.get(name)  # an unknown backend lists the registered ones
    fallback = Path(hf_model_config_path) if hf_model_config_path is not None else None
    own_config = weights_dir / HF_CONFIG_DIR
    if (own_config / CONFIG_FILE).is_file():
        config_dir = own_config
    elif fallback is not None and (fallback / CONFIG_FILE).is_file():
        config_dir = fallback
    else:
        raise CheckpointError(
            f"{weights_dir} has no {HF_CONFIG_DIR}/{CONFIG_FILE}"
            + (f" and {fallback} has no {CONFIG_FILE}" if fallback is not None else "")
            + "; pass --hf_model_config_path <the base model folder used for training>"
        )
    own_tokenizer = weights_dir / TOKENIZER_DIR
    tokenizer_dir = own_tokenizer if own_tokenizer.is_dir() else fallback
    return CheckpointSource(weights_dir, name, config_dir, tokenizer_dir)


def verify_source(weights_dir: Path) -> None:
    """Check a part of a committed checkpoint (``global_step_N/actor``) against the checksums
    its manifest recorded; a damaged file is refused by name. A folder outside a
    ``global_step_N`` checkpoint has no manifest to check against and is read as it is."""
    found = ckpt.checkpoint_of(weights_dir)
    if found is None:
        return
    root, part = found
    if not (root / ckpt.MANIFEST_FILE).is_file():
        logger.warning(
            "note: %s has no %s (an older or uncommitted checkpoint): its files are not verified",
            root,
            ckpt.MANIFEST_FILE,
        )
        return
    try:
        verified = ckpt.verify_checkpoint(root, part or None)
    except ckpt.CheckpointError as err:
        raise CheckpointError(f"refusing to read a damaged checkpoint: {err}") from err
    if not verified:
        logger.warning("%s", ckpt.unverified_note(root))


# --- rebuilding the model ------------------------------------------------------------------


def build_model(source: CheckpointSource, trust_remote_code: bool = False) -> torch.nn.Module:
    """The trained module rebuilt from its config and checkpoint weights (a ``PeftModel`` for LoRA).

    Generation defaults come from the checkpoint's ``generation_config.json`` when present.
    """
    tensors = CHECKPOINT_READERS.get(source.backend)(source.weights_dir)
    config = AutoConfig.from_pretrained(
        source.hf_config_dir, local_files_only=True, trust_remote_code=trust_remote_code
    )
    config.use_cache = True  # training with gradient checkpointing turns the KV cache off; inference wants it
    lora_config = _lora_config(source)
    if lora_config is not None and lora_config.base_model_name_or_path:
        # peft re-points the adapter at the model's name_or_path: keep the real base model
        config.name_or_path = lora_config.base_model_name_or_path
    auto_class = causal_lm_auto_class(is_vision_language_config(config))  # Qwen2-VL: the conditional-generation class
    model = auto_class.from_config(config, dtype=torch.float32, trust_remote_code=trust_remote_code)
    if (source.hf_config_dir / GENERATION_CONFIG_FILE).is_file():
        model.generation_config = GenerationConfig.from_pretrained(source.hf_config_dir, local_files_only=True)
    if lora_config is not None:
        from peft import get_peft_model

        model = get_peft_model(model, lora_config)
    elif any(_LORA_MARK in name for name in tensors):
        raise CheckpointError(
            f"{source.weights_dir} holds LoRA weights but {source.hf_config_dir} has no {ADAPTER_CONFIG_FILE} "
            "(rank, alpha and target modules are needed to rebuild the adapter)"
        )
    load_weights(model, tensors, source.weights_dir)
    return model.eval()


def _lora_config(source: CheckpointSource):
    """The checkpoint's ``peft.LoraConfig``, or None without LoRA (peft is imported only then)."""
    if not source.is_lora:
        return None
    from peft import LoraConfig

    return LoraConfig.from_pretrained(str(source.hf_config_dir))


def load_weights(module: torch.nn.Module, tensors: dict[str, torch.Tensor], where: Path) -> None:
    """Copy ``tensors`` into ``module``: every name must exist with the same shape, and every
    module tensor must be given (a tied alias counts as given when its partner is)."""
    expected = module.state_dict()
    aliases = _shared_names(expected)
    missing = [n for n in expected if n not in tensors and not any(a in tensors for a in aliases.get(n, ()))]
    unexpected = [n for n in tensors if n not in expected]
    wrong = [
        f"{n} {tuple(tensors[n].shape)} vs {tuple(expected[n].shape)}"
        for n in tensors
        if n in expected and tensors[n].shape != expected[n].shape
    ]
    problems = [
        f"{label} ({len(items)}): {', '.join(items[:5])}{', ...' if len(items) > 5 else ''}"
        for label, items in (
            ("missing", missing),
            ("unexpected", unexpected),
            ("shape mismatch, checkpoint vs config", wrong),
        )
        if items
    ]
    if problems:
        raise CheckpointError(f"{where}: the weights do not fit the model config: " + "; ".join(problems))
    with torch.no_grad():
        module.load_state_dict(tensors, strict=False)


def _shared_names(state: dict[str, torch.Tensor]) -> dict[str, list[str]]:
    """name → the other names viewing the same storage (tied embeddings)."""
    by_storage: dict[tuple[int, int, tuple[int, ...]], list[str]] = {}
    for name, tensor in state.items():
        if tensor.numel():
            key = (tensor.untyped_storage().data_ptr(), int(tensor.storage_offset()), tuple(tensor.shape))
            by_storage.setdefault(key, []).append(name)
    return {n: [m for m in group if m != n] for group in by_storage.values() if len(group) > 1 for n in group}


def merged_model(model: torch.nn.Module) -> torch.nn.Module:
    """A plain HF model: LoRA adapters folded into the base weights (``merge_and_unload``)."""
    merge = getattr(model, "merge_and_unload", None)  # a PeftModel's (forwarded to its LoRA model)
    return merge() if merge is not None else model
