"""Rows that repeat a prompt: run each distinct prompt through the model once.

GRPO, RLOO, DAPO... sample n responses per prompt, so a batch holds every prompt n times. In
a forward pass over ``[prompt | response]`` rows, the keys and values of the prompt's tokens
depend on the prompt alone. So before a chunk of micro-batches, :meth:`PromptCache.build`
runs the distinct prompts of the chunk's rows once (columns ``lo … P − 2``; ``lo`` = the
batch's first real column) and keeps every layer's keys and values; each micro-batch then
runs only columns ``P − 1 …`` of its rows, attending to their prompt's copy::

    chunk's distinct prompts (U rows) ──forward, columns lo … P−2──▶ K, V per layer (U, …)
    micro-batch (rows r) ──▶ forward, columns P−1 … hi−2, attending to K, V[prompt of r] ──▶ logits
    training: each micro-batch's backward leaves ∂loss/∂K, ∂V (summed over rows, float32) on
              the cache; :meth:`PromptCache.backward` then runs the prompt pass's backward once.

A chunk (``micro_batch.plan_prompt_chunks``) is a set of whole prompts holding no more
tokens than the largest micro-batch, so the prompt pass, whose activations stay until its
backward, never holds more than one micro-batch would; for a small batch (8 prompts of 50
tokens, micro-batches of 8 rows of ~115) it is the whole batch. Inside a chunk the rows keep
the length-sorted micro-batch plan, so the response part pays no extra padding.

Outputs and gradients equal the single-pass ones up to float rounding (the same products,
summed in another order); the prompt part of the compute drops from B rows to U. SmolLM2,
32 rows = 8 prompts × 4 samples, micro-batches of 8, forward + backward: bf16 3.4 s instead
of 4.4 s, fp32 8.7 s instead of 12.4 s.

It needs a Hugging Face decoder-only model that takes a ``cache`` whose layers are all plain
full-attention layers, no gradient checkpointing (HF's checkpointed layers drop the cache in
training) and no dropout in training (rows would share one dropout mask on the prompt):
:func:`shares_prompts` checks all of them; a forward function asks for the cache by
declaring a ``prompt_cache`` parameter (:func:`takes_prompt_cache`).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence

import torch
from tensordict import TensorDict
from transformers import DynamicCache, PreTrainedConfig
from transformers.cache_utils import DynamicLayer

from hybridflow import fields as FK

PROMPT_CACHE_ARG = "prompt_cache"  # the parameter by which a forward function asks for the cache


def distinct_prompts(
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    position_ids: torch.Tensor,
    images: Sequence[Mapping[str, torch.Tensor] | None] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(first, which)`` for left-padded prompts (B, P): ``first`` (U,) = the first row of each
    distinct prompt, in order of appearance; ``which`` (B,) = each row's prompt, an index into
    ``first``. Rows are the same prompt when their real tokens and positions match and — given
    ``images`` (one image-input dict or None per row) — their image tensors are equal too: two
    prompts with the same ids (the same image tokens) but other pixels are different prompts.
    Positions may be (B, P) or per-axis (B, 3, P)."""
    mask = attention_mask if position_ids.dim() == 2 else attention_mask[:, None]
    flat_positions = (position_ids * mask).reshape(position_ids.shape[0], -1)
    key = torch.cat([input_ids * attention_mask, attention_mask, flat_positions], dim=1)
    rows = torch.arange(key.shape[0], device=key.device)
    _, inverse = torch.unique(key, dim=0, return_inverse=True)
    if images is not None:
        inverse = _split_by_images(inverse, images)
    distinct = int(inverse.max()) + 1 if key.shape[0] else 0
    if distinct == key.shape[0]:
        return rows, rows
    first = torch.full((distinct,), key.shape[0], dtype=torch.long, device=key.device)
    first.scatter_reduce_(0, inverse, rows, reduce="amin")
    order = torch.argsort(first)
    rank = torch.empty_like(order)
    rank[order] = torch.arange(distinct, device=key.device)
    return first[order], rank[inverse]


def _split_by_images(groups: torch.Tensor, images: Sequence[Mapping[str, torch.Tensor] | None]) -> torch.Tensor:
    """Group ids refined so that rows of one group also hold equal image inputs (any numbering)."""
    if len(images) != groups.numel():
        raise ValueError(f"images: {len(images)} entries for {groups.numel()} prompt rows")
    # per token group, the representatives seen so far: (image inputs, refined id)
    seen: dict[int, list[tuple[Mapping[str, torch.Tensor] | None, int]]] = {}
    refined = torch.empty_like(groups)
    for row, group in enumerate(groups.tolist()):
        reps = seen.setdefault(group, [])
        match = next((rid for rep, rid in reps if _same_images(rep, images[row])), None)
        if match is None:
            match = _next_id(seen)
            reps.append((images[row], match))
        refined[row] = match
    return refined


def _next_id(seen: dict[int, list[tuple[Mapping[str, torch.Tensor] | None, int]]]) -> int:
    return sum(len(reps) for reps in seen.values())


def _same_images(a: Mapping[str, torch.Tensor] | None, b: Mapping[str, torch.Tensor] | None) -> bool:
    """Equal image inputs: the same object (the trainer's ×n copies share it), else equal tensors."""
    if a is b or (not a and not b):
        return True
    if not a or not b or a.keys() != b.keys():
        return False
    return all(torch.equal(a[k], b[k]) if isinstance(a[k], torch.Tensor) else a[k] == b[k] for k in a)


def _inner_model(module: torch.nn.Module) -> torch.nn.Module:
    """The Hugging Face model under a PEFT wrapper (``module`` itself otherwise)."""
    get_base = getattr(module, "get_base_model", None)
    return get_base() if callable(get_base) else module


def _hf_config(module: torch.nn.Module) -> PreTrainedConfig | None:
    """The Hugging Face config of the model under ``module`` (None: it has none)."""
    return getattr(_inner_model(module), "config", None)


def _require_hf_config(module: torch.nn.Module) -> PreTrainedConfig:
    config = _hf_config(module)
    if config is None:
        raise TypeError(f"{type(module).__name__} is not a Hugging Face model (no config): it cannot share prompts")
    return config


def _checkpoints_activations(model: torch.nn.Module) -> bool:
    # transformers 5 renamed is_gradient_checkpointing (now deprecated) to is_activation_checkpointing.
    if hasattr(type(model), "is_activation_checkpointing"):
        return bool(model.is_activation_checkpointing)
    return bool(getattr(model, "is_gradient_checkpointing", False))


def _has_dropout(model: torch.nn.Module) -> bool:
    if float(getattr(model.config, "attention_dropout", 0.0) or 0.0) > 0:
        return True
    return any(isinstance(m, torch.nn.Dropout) and m.p > 0 for m in model.modules())


def shares_prompts(module: torch.nn.Module, training: bool) -> bool:
    """Whether ``module`` can run repeated prompts once, in training or at inference (see
    the module docstring)."""
    model = _inner_model(module)
    config = _hf_config(module)
    if config is None or _checkpoints_activations(model):
        return False
    if "cache" not in inspect.signature(model.forward).parameters:
        return False
    if training and _has_dropout(model):
        return False
    layers = DynamicCache(config=config).layers
    return bool(layers) and all(type(layer) is DynamicLayer for layer in layers)


def _prompt_columns(batch: TensorDict) -> slice | None:
    """Columns ``lo … P − 2``: every prompt's tokens but the last (``None``: none, or no
    prompt/response split or position ids in the batch)."""
    if not all(key in batch.keys() for key in (FK.INPUT_IDS, FK.ATTENTION_MASK, FK.POSITION_IDS, FK.RESPONSES)):
        return None
    prompt_len = batch[FK.INPUT_IDS].shape[1] - batch[FK.RESPONSES].shape[1]
    used = batch[FK.ATTENTION_MASK][:, : max(prompt_len - 1, 0)].bool().any(dim=0).nonzero().flatten()
    return slice(int(used[0]), prompt_len - 1) if used.numel() else None


def _prompt_inputs(batch: TensorDict, cols: slice) -> dict[str, torch.Tensor]:
    return {
        "input_ids": batch[FK.INPUT_IDS][:, cols],
        "attention_mask": batch[FK.ATTENTION_MASK][:, cols],
        "position_ids": batch[FK.POSITION_IDS][:, cols],
    }


def prompt_groups(batch: TensorDict) -> tuple[list[int], int] | None:
    """``(prompt of each row, columns of a prompt's shared part)``, or ``None`` when no two rows
    share a prompt (or the batch cannot tell prompts apart, see ``_prompt_columns``)."""
    cols = _prompt_columns(batch)
    if cols is None:
        return None
    inputs = _prompt_inputs(batch, cols)
    first, which = distinct_prompts(inputs["input_ids"], inputs["attention_mask"], inputs["position_ids"])
    if first.numel() == which.numel():
        return None
    return which.tolist(), cols.stop - cols.start


def takes_prompt_cache(forward_fn: Callable[..., object]) -> bool:
    """Whether ``forward_fn`` declares a ``prompt_cache`` parameter (works through ``partial``)."""
    return PROMPT_CACHE_ARG in inspect.signature(forward_fn).parameters


class PromptCache:
    """Every layer's keys and values of a batch's distinct prompts, columns ``start … P − 2``."""

    def __init__(self, module: torch.nn.Module, kv: list[torch.Tensor], which: torch.Tensor, start: int) -> None:
        self.config = _require_hf_config(module)
        self.which = which  # batch row → distinct prompt (−1: a row outside this cache)
        self.start = start
        self._kv = kv  # [keys of layer 0, values of layer 0, keys of layer 1, ...], (U, heads, columns, d)
        # With gradients on, micro-batches read float32 copies that collect ∂loss/∂K, ∂V
        # (float32 so that rows summed onto one prompt lose no precision in bf16).
        self._leaves = [t.detach().float().requires_grad_() for t in kv] if torch.is_grad_enabled() else kv

    @classmethod
    def build(
        cls, module: torch.nn.Module, batch: TensorDict, rows: list[int], device: torch.device
    ) -> PromptCache | None:
        """Run the distinct prompts of ``batch``'s ``rows`` through ``module`` once; ``None``
        when no two of the rows share a prompt, when the batch cannot tell prompts apart, or
        when the prompts are one token long (the last prompt token always runs with its row)."""
        cols = _prompt_columns(batch)
        if cols is None:
            return None
        index = torch.tensor(sorted(rows), dtype=torch.long)  # prompts in batch order, whatever the plan's
        inputs = {name: t[index] for name, t in _prompt_inputs(batch, cols).items()}
        first, which = distinct_prompts(inputs["input_ids"], inputs["attention_mask"], inputs["position_ids"])
        if first.numel() == which.numel():
            return None
        cache = DynamicCache(config=_require_hf_config(module))
        nothing = torch.zeros(0, dtype=torch.long, device=device)  # no logits wanted from the prompt pass
        module(
            **{name: tensor[first].to(device) for name, tensor in inputs.items()},
            cache=cache,
            use_cache=True,
            logits_to_keep=nothing,
        )
        kv: list[torch.Tensor] = []
        for layer in cache.layers:  # full-attention layers (shares_prompts), filled by the prompt pass
            assert isinstance(layer, DynamicLayer) and layer.keys is not None and layer.values is not None
            kv += [layer.keys, layer.values]
        prompt_of_row = torch.full((batch.batch_size[0],), -1, dtype=torch.long)
        prompt_of_row[index] = which
        return cls(module, kv, prompt_of_row.to(device), cols.start)

    def for_rows(self, rows: torch.Tensor, start: int) -> DynamicCache:
        """A cache holding, for each batch row in ``rows``, its prompt's columns ``start … P − 2``."""
        if start < self.start:
            raise ValueError(f"the prompt cache starts at column {self.start}, not {start}")
        index = self.which[rows.to(self.which.device)]
        if bool((index < 0).any()):
            raise ValueError("rows outside this prompt cache's chunk")
        cut = start - self.start
        kv = [leaf[index, :, cut:].to(out.dtype) for leaf, out in zip(self._leaves, self._kv)]
        return DynamicCache(ddp_cache_data=list(zip(kv[0::2], kv[1::2])), config=self.config)

    def backward(self) -> None:
        """Carry the gradients that the micro-batches left on the cache through the prompt pass."""
        # Some keys/values may not depend on a trainable parameter (LoRA on v_proj only: no key does).
        pairs = [
            (out, leaf.grad) for out, leaf in zip(self._kv, self._leaves) if leaf.grad is not None and out.requires_grad
        ]
        if pairs:
            torch.autograd.backward([out for out, _ in pairs], [grad.to(out.dtype) for out, grad in pairs])
        self._leaves = self._kv = []


class PromptRows:
    """The prompt cache as one micro-batch sees it: the batch-wide cache and the micro-batch's rows."""

    def __init__(self, cache: PromptCache, rows: torch.Tensor) -> None:
        self._cache = cache
        self._rows = rows

    def dynamic_cache(self, start: int) -> DynamicCache:
        """These rows' prompt keys and values from column ``start`` (≥ :attr:`start`) on."""
        return self._cache.for_rows(self._rows, start)
