"""Running a forward function over a batch in micro-batches (shared by engines and the reference).

A run is a list of :class:`Chunk` s, each a list of micro-batches (lists of row indices, see
:mod:`hybridflow.engine.micro_batch`). :func:`plan_chunks` makes it: when rows repeat a
prompt and both the module and the forward function can share it, one chunk per group of
whole prompts, whose distinct prompts run once before its micro-batches
(:mod:`hybridflow.engine.shared_prompt`); otherwise one chunk holding the plain plan (always
for rows with images or 3-D positions, :mod:`hybridflow.engine.multimodal_inputs`).
``infer_plan`` / ``train_micro_batches`` take a ready plain plan, so an engine can adjust it
first — the FSDP engine makes every data-parallel rank run the same number of micro-batches.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, replace

import torch
from tensordict import TensorDict

from hybridflow import fields as FK
from hybridflow.engine.micro_batch import (
    MicroBatchSpec,
    plan_micro_batches,
    plan_prompt_chunks,
    restore_order,
)
from hybridflow.engine.multimodal_inputs import is_multimodal, log_step_aside
from hybridflow.engine.shared_prompt import (
    PROMPT_CACHE_ARG,
    PromptCache,
    PromptRows,
    prompt_groups,
    shares_prompts,
    takes_prompt_cache,
)

# forward_fn(module, micro) → outputs; one that also declares ``prompt_cache`` is given the
# keys and values of its rows' prompts when they were run once (see plan_chunks).
ForwardFn = Callable[..., dict[str, torch.Tensor]]
LossFn = Callable[[dict[str, torch.Tensor], TensorDict], tuple[torch.Tensor, dict[str, torch.Tensor]]]


@dataclass(frozen=True)
class Chunk:
    """Micro-batches run one after another; with ``shared_prompts`` the distinct prompts of
    all their rows first run once, and the micro-batches attend to that copy."""

    micro_batches: list[list[int]]
    shared_prompts: bool = False

    @property
    def rows(self) -> list[int]:
        return [row for micro in self.micro_batches for row in micro]


def make_plan(batch: TensorDict, spec: MicroBatchSpec | None) -> list[list[int]]:
    """Micro-batch plan for ``batch`` (``spec=None``: the whole batch at once)."""
    n = int(batch.batch_size[0])
    if spec is None:
        return [list(range(n))] if n else []
    if spec.real_tokens and is_multimodal(batch):
        # Such rows are never packed (forward.worth_packing): budget their padded size.
        log_step_aside("the real-token budget", "rows with images or 3-D positions run padded: rows × longest counted")
        spec = replace(spec, real_tokens=False)
    return plan_micro_batches(_row_lengths(batch), spec)


def _row_lengths(batch: TensorDict) -> list[int]:
    if FK.ATTENTION_MASK not in batch.keys():
        raise KeyError(f"micro-batching needs {FK.ATTENTION_MASK!r} in the batch; keys: {sorted(batch.keys())}")
    return batch[FK.ATTENTION_MASK].sum(dim=-1).tolist()


def plan_chunks(
    module: torch.nn.Module, batch: TensorDict, forward_fn: ForwardFn, spec: MicroBatchSpec | None, training: bool
) -> list[Chunk]:
    """How to run ``forward_fn`` over ``batch``: repeated prompts run once per chunk of whole
    prompts when ``forward_fn`` takes a ``prompt_cache`` and ``module`` can use one
    (:func:`~hybridflow.engine.shared_prompt.shares_prompts`); else :func:`make_plan`'s plan."""
    groups = None
    if takes_prompt_cache(forward_fn) and shares_prompts(module, training):
        if is_multimodal(batch):
            # Equal prompt ids can hold different images (same grid, other pixels).
            log_step_aside("the shared-prompt pass", "rows with images or 3-D positions run their prompts themselves")
        else:
            groups = prompt_groups(batch)
    if groups is None:
        return [Chunk(make_plan(batch, spec))]
    prompt_of, prompt_tokens = groups
    chunks = plan_prompt_chunks(_row_lengths(batch), prompt_of, prompt_tokens, spec)
    return [Chunk(micro_batches, shared_prompts=True) for micro_batches in chunks]


def iter_micro_batches(
    batch: TensorDict, plan: list[list[int]], device: torch.device
) -> Iterator[tuple[torch.Tensor, TensorDict]]:
    """``(row indices, rows)`` of each micro-batch, in plan order, the rows moved to ``device``."""
    for rows in plan:
        index = torch.tensor(rows, dtype=torch.long)
        yield index, batch[index].to(device)


def _forward(
    forward_fn: ForwardFn, module: torch.nn.Module, micro: TensorDict, rows: torch.Tensor, prompts: PromptCache | None
) -> dict[str, torch.Tensor]:
    if prompts is None:
        return forward_fn(module, micro)
    return forward_fn(module, micro, **{PROMPT_CACHE_ARG: PromptRows(prompts, rows)})


def autocast_context(device: torch.device, dtype: torch.dtype | None) -> AbstractContextManager:
    """Mixed-precision context for ``dtype`` (``None``: run in the parameters' dtype)."""
    if dtype is None:
        return nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


def autocast_paused(device: torch.device, dtype: torch.dtype | None) -> AbstractContextManager:
    """Autocast switched off inside a region opened by ``autocast_context(device, dtype)``;
    the region's cached weight casts survive, unlike leaving and re-entering it."""
    if dtype is None:
        return nullcontext()
    return torch.autocast(device_type=device.type, enabled=False)


@torch.no_grad()
def infer_micro_batches(
    module: torch.nn.Module,
    batch: TensorDict,
    forward_fn: ForwardFn,
    spec: MicroBatchSpec | None,
    device: torch.device,
    autocast_dtype: torch.dtype | None = None,
) -> dict[str, torch.Tensor]:
    """``forward_fn`` per micro-batch, no gradients, module in eval mode; outputs in batch order on CPU."""
    chunks = plan_chunks(module, batch, forward_fn, spec, training=False)
    return infer_chunks(module, batch, forward_fn, chunks, device, autocast_dtype)


def infer_plan(
    module: torch.nn.Module,
    batch: TensorDict,
    forward_fn: ForwardFn,
    plan: list[list[int]],
    device: torch.device,
    autocast_dtype: torch.dtype | None = None,
) -> dict[str, torch.Tensor]:
    """:func:`infer_micro_batches` over a given plain ``plan``."""
    return infer_chunks(module, batch, forward_fn, [Chunk(plan)], device, autocast_dtype)


@torch.no_grad()
def infer_chunks(
    module: torch.nn.Module,
    batch: TensorDict,
    forward_fn: ForwardFn,
    chunks: list[Chunk],
    device: torch.device,
    autocast_dtype: torch.dtype | None = None,
) -> dict[str, torch.Tensor]:
    """:func:`infer_micro_batches` over given ``chunks``."""
    plan = [micro for chunk in chunks for micro in chunk.micro_batches]
    if not any(plan):
        raise ValueError("cannot run a forward pass over an empty batch")
    was_training = module.training
    module.eval()
    parts: dict[str, list[torch.Tensor]] = {}
    try:
        # One autocast region for the whole run: autocast caches its bf16 copies of the
        # fp32 weights until the region ends, so they are cast once, not once per micro-batch.
        with autocast_context(device, autocast_dtype):
            for chunk in chunks:
                prompts = PromptCache.build(module, batch, chunk.rows, device) if chunk.shared_prompts else None
                for rows, micro in iter_micro_batches(batch, chunk.micro_batches, device):
                    outputs = _forward(forward_fn, module, micro, rows, prompts)
                    for key, value in outputs.items():
                        parts.setdefault(key, []).append(value.detach().cpu())
    finally:
        module.train(was_training)
    return {key: restore_order(values, plan) for key, values in parts.items()}


def train_micro_batches(
    module: torch.nn.Module,
    batch: TensorDict,
    forward_fn: ForwardFn,
    loss_fn: LossFn,
    plan: list[list[int]],
    device: torch.device,
    autocast_dtype: torch.dtype | None = None,
) -> list[dict[str, torch.Tensor]]:
    """:func:`train_chunks` over a given plain ``plan``."""
    return train_chunks(module, batch, forward_fn, loss_fn, [Chunk(plan)], device, autocast_dtype)


def train_chunks(
    module: torch.nn.Module,
    batch: TensorDict,
    forward_fn: ForwardFn,
    loss_fn: LossFn,
    chunks: list[Chunk],
    device: torch.device,
    autocast_dtype: torch.dtype | None = None,
) -> list[dict[str, torch.Tensor]]:
    """Forward + ``loss.backward()`` per micro-batch (gradients add up); each one's metrics,
    detached and on CPU. The module is put in train mode. In a chunk with shared prompts the
    prompts' forward runs once before its micro-batches and its backward once after them."""
    if not any(micro for chunk in chunks for micro in chunk.micro_batches):
        raise ValueError("cannot train on an empty batch")
    module.train()
    metrics: list[dict[str, torch.Tensor]] = []
    # As in infer_chunks, one autocast region casts the weights once for all micro-batches
    # (SmolLM2, bf16, 4 micro-batches: ~0.3 s less per update). The backward runs with
    # autocast switched off inside it, as autocast asks; that keeps the cached casts.
    with autocast_context(device, autocast_dtype):
        for chunk in chunks:
            prompts = PromptCache.build(module, batch, chunk.rows, device) if chunk.shared_prompts else None
            for rows, micro in iter_micro_batches(batch, chunk.micro_batches, device):
                outputs = _forward(forward_fn, module, micro, rows, prompts)
                loss, micro_metrics = loss_fn(outputs, micro)
                with autocast_paused(device, autocast_dtype):
                    loss.backward()
                metrics.append({k: v.detach().cpu() for k, v in micro_metrics.items()})
            if prompts is not None:
                with autocast_paused(device, autocast_dtype):
                    prompts.backward()
    return metrics
