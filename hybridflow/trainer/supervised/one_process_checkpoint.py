"""Resuming a one-process checkpoint (the torch engine's files) on sharded data-parallel ranks.

A run started as plain ``hybridflow sft`` writes ``model.safetensors`` + ``optimizer.pt`` +
``extra_state.pt`` (:mod:`hybridflow.engine.checkpoint`); continued under torchrun its engine is
the FSDP one, whose own checkpoints are DCP shards. :func:`load_one_process_checkpoint` loads
the one-process files into the sharded engine, all ranks together:

* weights: every rank reads the full tensors and ``set_model_state_dict(full_state_dict=True)``
  keeps its rows (a tied weight saved once under one of its names counts for all of them);
* AdamW state: ``optimizer.pt`` numbers the parameters in the order the torch engine listed
  them (``module.parameters()`` with ``requires_grad``); the same order of this module's names
  turns it into the name-keyed form ``set_optimizer_state_dict`` shards;
* lr schedule: stepped ``step`` times from its start (the schedule is a function of the step);
  the RNG states are not restored (they belong to one process), as when DCP reshards.

The other direction (a sharded checkpoint in one plain process) is refused with a message: it
resumes under ``torchrun --nproc_per_node=1``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from hybridflow.engine.checkpoint import MODEL_FILE, OPTIMIZER_FILE, CheckpointFileError, load_torch_data
from hybridflow.engine.torch_engine import TorchEngine


def load_one_process_checkpoint(engine: TorchEngine, folder: Path, step: int) -> None:
    """Load the torch engine's checkpoint ``folder`` (written at ``step``) into the sharded
    ``engine`` (collective: every rank calls it)."""
    module = engine.module
    try:
        tensors: dict[str, Any] = load_file(folder / MODEL_FILE)
    except Exception as err:  # safetensors raises its own error type for damaged files
        raise CheckpointFileError(folder / MODEL_FILE, f"could not read the weights: {err}") from err
    _check_names(module, tensors, folder / MODEL_FILE)
    set_model_state_dict(module, tensors, options=StateDictOptions(full_state_dict=True, strict=False))
    by_name = _optimizer_state_by_name(module, load_torch_data(folder / OPTIMIZER_FILE), folder / OPTIMIZER_FILE)
    set_optimizer_state_dict(module, engine.optimizer, by_name, options=StateDictOptions(full_state_dict=True))
    for _ in range(step):
        engine.lr_scheduler_step()


def _check_names(module: torch.nn.Module, tensors: dict[str, Any], file: Path) -> None:
    """Every weight of ``module`` is in the file (under one of its tied names), nothing else is."""
    aliases: dict[int, list[str]] = {}
    for name, param in module.named_parameters(remove_duplicate=False):
        aliases.setdefault(id(param), []).append(name)
    expected = set(module.state_dict())
    unexpected = sorted(set(tensors) - expected)
    missing = sorted(name for names in aliases.values() if not any(n in tensors for n in names) for name in names[:1])
    missing += sorted(name for name in expected if name not in tensors and not _is_parameter(name, aliases))
    if unexpected or missing:
        raise CheckpointFileError(
            file, f"does not fit the model: missing {missing[:5] or 'none'}, unexpected {unexpected[:5] or 'none'}"
        )


def _is_parameter(name: str, aliases: dict[int, list[str]]) -> bool:
    return any(name in names for names in aliases.values())


def _optimizer_state_by_name(module: torch.nn.Module, state: Any, file: Path) -> dict[str, Any]:
    """``optimizer.pt`` (parameters numbered 0..n-1) keyed by this module's parameter names."""
    names = [name for name, param in module.named_parameters() if param.requires_grad]
    if not isinstance(state, dict) or not {"state", "param_groups"} <= state.keys():
        raise CheckpointFileError(file, "is not an optimizer state (needs state and param_groups)")
    numbered = [index for group in state["param_groups"] for index in group["params"]]
    if sorted(numbered) != list(range(len(names))):
        raise CheckpointFileError(
            file,
            f"numbers {len(numbered)} parameters, but the model trains {len(names)}: another model or LoRA setting",
        )
    return {
        "state": {names[index]: value for index, value in state["state"].items()},
        "param_groups": [{**group, "params": [names[i] for i in group["params"]]} for group in state["param_groups"]],
    }
