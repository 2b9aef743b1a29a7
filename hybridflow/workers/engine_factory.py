"""Build a training engine from a role's config (the engine itself never sees config objects)."""

from __future__ import annotations

from collections.abc import Callable

import torch

from hybridflow.config import OptimConfig
from hybridflow.engine import ENGINES, MicroBatchSpec, TrainEngine
from hybridflow.utils.precision import resolve_compute_dtype


def resolve_strategy(strategy: str, world_size: int) -> str:
    """``auto`` → ``torch`` for one process, ``fsdp`` for several; other names pass through."""
    if strategy == "auto":
        return "torch" if world_size == 1 else "fsdp"
    return strategy


def needs_process_group(strategy: str, world_size: int) -> bool:
    """True when the engine ``strategy`` resolves to trains across ranks (FSDP): the worker must
    join the torch.distributed group (``Worker.init_process_group()``) before building it."""
    return ENGINES.meta(resolve_strategy(strategy, world_size)).multi_process


def autocast_dtype_for(dtype: str, device: torch.device | str) -> torch.dtype | None:
    """Trainable roles keep fp32 parameters (bf16 cannot hold small AdamW updates) and, for
    ``dtype=bf16`` (or ``auto`` resolved to bf16 on this hardware), compute under bf16
    autocast; fp32 runs without autocast."""
    if dtype == "auto":
        dtype = resolve_compute_dtype(dtype, device)
    if dtype == "bf16":
        return torch.bfloat16
    if dtype == "fp32":
        return None
    raise ValueError(f"unsupported dtype {dtype!r}; valid: auto, fp32, bf16")


def build_engine(
    module: torch.nn.Module,
    optim: OptimConfig,
    *,
    strategy: str,
    grad_clip: float,
    micro_batch: MicroBatchSpec,
    total_training_steps: int | None,
    device: torch.device | str,
    dtype: str,
    world_size: int,
    owner: str,
) -> TrainEngine:
    """The engine named by ``strategy`` for ``module``, with the optimizer of ``optim``."""
    name = resolve_strategy(strategy, world_size)
    spec = ENGINES.meta(name)  # unknown names raise here, listing the registered engines
    if world_size > 1 and not spec.multi_process:
        raise ValueError(
            f"{owner}.strategy={strategy!r} resolves to the {name!r} engine, which trains in one process, "
            f"but this group has {world_size} ranks"
        )
    # every registered engine takes these keywords; the abstract TrainEngine declares no constructor
    engine_cls: Callable[..., TrainEngine] = ENGINES.get(name)
    return engine_cls(
        module,
        lr=optim.lr,
        betas=(float(optim.betas[0]), float(optim.betas[1])),
        weight_decay=optim.weight_decay,
        warmup_steps=max(optim.lr_warmup_steps, 0),
        warmup_ratio=optim.lr_warmup_steps_ratio,
        total_steps=total_training_steps,
        scheduler_type=optim.lr_scheduler_type,
        min_lr_ratio=optim.min_lr_ratio,
        num_cycles=optim.num_cycles,
        grad_clip=grad_clip,
        micro_batch_size=micro_batch.size,
        max_token_len=micro_batch.max_token_len,
        real_token_budget=micro_batch.real_tokens,
        device=device,
        autocast_dtype=autocast_dtype_for(dtype, device),
    )
