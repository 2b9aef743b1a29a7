"""What a training checkpoint needs besides its weights to become a Hugging Face folder again.

An engine checkpoint holds the module's state dict only. The actor writes this metadata next
to it, in ``hf_config/``, so the model merger needs nothing but the checkpoint::

    hf_config/
      config.json              the (base) model's config
      generation_config.json   its generation defaults, when the model has them
      adapter_config.json      the LoRA adapter config (peft format), only when trained with LoRA
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import torch

HF_CONFIG_DIR = "hf_config"
CONFIG_FILE = "config.json"
GENERATION_CONFIG_FILE = "generation_config.json"
ADAPTER_CONFIG_FILE = "adapter_config.json"


def split_peft(module: torch.nn.Module) -> tuple[torch.nn.Module, Any | None]:
    """``(HF model, LoRA config)`` of a ``PeftModel`` with one adapter; ``(module, None)`` otherwise.

    A module can only be a ``PeftModel`` if peft was imported, so a plain model never pays
    for importing it.
    """
    peft = sys.modules.get("peft")
    if peft is None or not isinstance(module, peft.PeftModel):
        return module, None
    if len(module.peft_config) != 1:
        raise ValueError(f"expected one LoRA adapter, found {len(module.peft_config)}: {sorted(module.peft_config)}")
    (adapter_config,) = module.peft_config.values()
    return module.get_base_model(), adapter_config


def save_hf_metadata(module: torch.nn.Module, path: str | os.PathLike) -> Path:
    """Write ``config.json`` (+ ``generation_config.json``, ``adapter_config.json``) of ``module``.

    ``module`` is a ``transformers`` model or a ``PeftModel`` around one. Returns the folder.
    """
    path = Path(path)
    model, adapter_config = split_peft(module)
    config = getattr(model, "config", None)
    if config is None or not hasattr(config, "save_pretrained"):
        raise TypeError(f"{type(model).__name__} has no Hugging Face config to save")
    path.mkdir(parents=True, exist_ok=True)
    config.save_pretrained(path)
    generation_config = getattr(model, "generation_config", None)
    if generation_config is not None:
        generation_config.save_pretrained(path)
    if adapter_config is not None:
        adapter_config.save_pretrained(path)
    return path
