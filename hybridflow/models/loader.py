"""Load a causal LM and its tokenizer from a local folder or a known name.

Options mirror ``actor_rollout_ref.model.*``: dtype, gradient checkpointing and LoRA (peft).
Everything is read with ``local_files_only=True``: a missing file fails at once instead of
trying the hub. Weights in pickle files (``pytorch_model.bin``) are read by transformers with
``weights_only=True``; a file holding anything but tensors is refused with the checkpoint
loader's message naming it (:func:`weights_load_error`), never unpickled. Tied input/output embeddings (SmolLM2) stay tied: we never untie them, and
peft's ``all-linear`` leaves the LM head alone.
"""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from transformers import (
    AutoModelForCausalLM,
    AutoModelForImageTextToText,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from hybridflow.engine.checkpoint import pickle_refusal
from hybridflow.models.processor import load_processor
from hybridflow.models.sources import resolve_model_path
from hybridflow.utils.errors import InputError

DTYPES: dict[str, torch.dtype] = {
    "fp32": torch.float32,
    "float32": torch.float32,
    "bf16": torch.bfloat16,
    "bfloat16": torch.bfloat16,
}


class ModelLoadError(InputError, RuntimeError):
    """A model folder exists but its contents cannot be loaded (corrupt or incomplete files)."""


# What transformers' loaders raise for a folder whose weights cannot be read: a damaged
# safetensors file, a missing one, a bad config, a pickle refused by its weights_only load.
WEIGHT_LOAD_ERRORS: tuple[type[BaseException], ...] = (SafetensorError, OSError, ValueError, pickle.UnpicklingError)


def weights_load_error(folder: str | os.PathLike, err: BaseException, what: str = "model weights") -> ModelLoadError:
    """The one-line error for ``err`` raised while loading ``folder``'s weights. A refused pickle
    names the pickle file(s) and says why, as a refused checkpoint file is reported."""
    if isinstance(err, pickle.UnpicklingError):
        pickles = sorted(Path(folder).glob("*.bin")) or sorted(Path(folder).glob("*.pt"))
        where = ", ".join(str(p) for p in pickles) if pickles else str(folder)
        return ModelLoadError(f"{where}: {pickle_refusal(err)}")
    return ModelLoadError(f"could not load {what} from {folder}: {err}")


def parse_dtype(dtype: str | torch.dtype) -> torch.dtype:
    """``"fp32"``/``"bf16"`` (or the torch dtype itself) → ``torch.dtype``."""
    if isinstance(dtype, torch.dtype):
        if dtype in DTYPES.values():
            return dtype
    elif dtype in DTYPES:
        return DTYPES[dtype]
    raise ValueError(f"unsupported model dtype {dtype!r}; valid: {', '.join(DTYPES)}")


def load_tokenizer(path: str | os.PathLike, trust_remote_code: bool = False) -> PreTrainedTokenizerBase:
    """The tokenizer of a model folder / known name; pad token falls back to eos if unset."""
    folder = resolve_model_path(path)
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True, trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as err:
        raise ModelLoadError(f"could not load the tokenizer in {folder}: {err}") from err
    if tokenizer.pad_token_id is None:
        if tokenizer.eos_token_id is None:
            raise ModelLoadError(f"tokenizer in {folder} has neither a pad nor an eos token")
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_model_and_tokenizer(
    path: str | os.PathLike,
    dtype: str | torch.dtype = "fp32",
    gradient_checkpointing: bool = False,
    lora_rank: int = 0,
    lora_alpha: float = 16,
    target_modules: str | list[str] = "all-linear",
    trust_remote_code: bool = False,
    attn_implementation: str | None = None,
) -> tuple[torch.nn.Module, PreTrainedTokenizerBase]:
    """``(model, tokenizer)`` for ``path`` (HF folder, ``smollm2-135m-instruct``, ``tiny-llama``...).

    With ``lora_rank > 0`` the model is a ``peft.PeftModel`` whose only trainable parameters
    are the adapters; ``with model.disable_adapter():`` gives the base model (the reference
    policy, without a second copy in memory). ``attn_implementation``: HF's attention kernel
    (``eager``, ``sdpa``; ``None`` = the model's default, see
    :func:`hybridflow.models.attention.choose_attn_implementation`). The model is returned in eval mode.
    """
    folder = resolve_model_path(path)
    tokenizer = load_tokenizer(folder, trust_remote_code=trust_remote_code)
    model = load_causal_lm(
        folder, dtype=dtype, trust_remote_code=trust_remote_code, attn_implementation=attn_implementation
    )
    if gradient_checkpointing:
        enable_gradient_checkpointing(model)
    wrapped: torch.nn.Module = model
    if lora_rank > 0:
        wrapped = apply_lora(model, lora_rank, lora_alpha, target_modules)
    elif lora_rank < 0:
        raise ValueError(f"lora_rank must be >= 0, got {lora_rank}")
    return wrapped.eval(), tokenizer


def load_causal_lm(
    folder: Path,
    dtype: str | torch.dtype = "fp32",
    trust_remote_code: bool = False,
    attn_implementation: str | None = None,
) -> PreTrainedModel:
    """The folder's language model, with load failures named clearly (an unsupported ``dtype`` is
    a ValueError, raised before loading). A vision-language folder (Qwen2-VL, Qwen2.5-VL: its
    config has a ``vision_config``) loads through ``AutoModelForImageTextToText``, which transformers
    maps to the conditional-generation class (vision tower + language model + LM head); that class
    is a causal LM to the rest of hybridflow (same forward, logits over the vocabulary). Other
    folders load through ``AutoModelForCausalLM``."""
    auto_class = causal_lm_auto_class(is_vision_language_folder(folder))
    return load_pretrained(auto_class, folder, parse_dtype(dtype), trust_remote_code, attn_implementation)


def causal_lm_auto_class(vision_language: bool) -> Any:
    """The ``AutoModel*`` class that builds a folder's language model: transformers maps
    Qwen2-VL-family configs only under ``AutoModelForImageTextToText`` (their conditional-generation
    class), text models under ``AutoModelForCausalLM``. Every loader of a policy-shaped model
    (training, export, comparison) picks through here, so none needs a registration of the
    vision classes under ``AutoModelForCausalLM``."""
    return AutoModelForImageTextToText if vision_language else AutoModelForCausalLM


def is_vision_language_config(config: Any) -> bool:
    """Whether a loaded config object (``AutoConfig``) describes a vision-language model: the
    in-memory form of :func:`is_vision_language_folder`'s check (a ``vision_config``)."""
    return getattr(config, "vision_config", None) is not None


def is_vision_language_folder(folder: str | os.PathLike) -> bool:
    """Whether ``folder``'s ``config.json`` describes a vision-language model (has a
    ``vision_config``). Read as plain JSON, so no model class is resolved to answer; a folder
    without a readable config is not one (the model load then names what is missing)."""
    config = Path(folder) / "config.json"
    try:
        data = json.loads(config.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and isinstance(data.get("vision_config"), dict)


def load_vision_processor(path: str | os.PathLike) -> Any | None:
    """The processor of a vision-language model (a folder or known name whose config has a
    ``vision_config``), which turns chat image parts into pixels and image tokens; None for a
    text model."""
    folder = resolve_model_path(path)
    return load_processor(folder) if is_vision_language_folder(folder) else None


def load_pretrained(
    auto_class: Any,
    folder: str | os.PathLike,
    dtype: str | torch.dtype,
    trust_remote_code: bool,
    attn_implementation: str | None,
    what: str = "model weights",
    errors: tuple[type[BaseException], ...] = WEIGHT_LOAD_ERRORS,
    **kwargs: Any,
) -> PreTrainedModel:
    """``auto_class.from_pretrained`` (an ``AutoModel*`` class) on the local ``folder`` in ``dtype``,
    with ``attn_implementation`` when set and ``kwargs``. A failure among ``errors`` (a bad
    ``dtype`` included) is raised as :func:`weights_load_error`, naming ``what`` was loaded."""
    extra: dict[str, Any] = {} if attn_implementation is None else {"attn_implementation": attn_implementation}
    try:
        return auto_class.from_pretrained(
            folder, dtype=parse_dtype(dtype), local_files_only=True, trust_remote_code=trust_remote_code,
            **extra, **kwargs,
        )  # fmt: skip
    except errors as err:
        raise weights_load_error(folder, err, what) from err


def enable_gradient_checkpointing(model: PreTrainedModel) -> None:
    """Recompute activations in backward (non-reentrant, so frozen inputs with LoRA work)."""
    model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    model.config.use_cache = False


def apply_lora(
    model: PreTrainedModel,
    lora_rank: int,
    lora_alpha: float,
    target_modules: str | list[str],
    task_type: str = "CAUSAL_LM",
) -> torch.nn.Module:
    """Wrap ``model`` with LoRA adapters (B initialised to 0, so outputs are unchanged at first)."""
    from peft import LoraConfig, get_peft_model  # peft import is slow; only pay for it when used

    if lora_alpha <= 0:
        raise ValueError(f"lora_alpha must be > 0, got {lora_alpha}")
    config = LoraConfig(
        r=lora_rank,
        lora_alpha=lora_alpha,  # type: ignore[arg-type]  # peft annotates int but only divides by r: a float alpha works
        target_modules=target_modules,
        lora_dropout=0.0,  # dropout would break split invariance and log-prob agreement
        bias="none",
        task_type=task_type,
    )
    return get_peft_model(model, config)
