"""Splitting a batch into micro-batches: by row count, or by a token budget.

A plan is a list of micro-batches, each a list of row indices into the batch. Outputs
computed micro-batch by micro-batch are put back in the batch's order with
:func:`restore_order`.

* by count (``*_micro_batch_size_per_gpu``): ``size`` rows at a time, taken in order of
  length (longest first, ties in batch order). Which rows share a micro-batch changes no
  result beyond float rounding — losses are normalised over the mini-batch — but each
  micro-batch is cut to its longest row (:mod:`hybridflow.engine.forward`), so grouping rows
  of similar length skips padding;
* by token budget (``use_dynamic_bsz`` + ``*_max_token_len_per_gpu``): rows sorted by length
  (longest first, ties in batch order) and packed greedily while ``rows × longest ≤ budget``
  — the padded size of the micro-batch — so rows of similar length share a micro-batch and
  little compute goes to padding. With ``real_tokens`` (the model packs rows without padding,
  ``use_remove_padding``) the budget counts real tokens instead, as verl's does: the rows'
  summed lengths stay ≤ budget.

Rows that repeat a prompt (n samples each) can be planned in chunks of whole prompts
(:func:`plan_prompt_chunks`), whose prompts then run once per chunk
(:mod:`hybridflow.engine.shared_prompt`).

Data-parallel ranks that share sharded weights (FSDP) must run the same number of forward
passes; :func:`split_plan_to` splits a plan's micro-batches until it has a given count.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class MicroBatchSpec:
    """Exactly one of ``size`` (rows per micro-batch) or ``max_token_len`` (token budget)."""

    size: int | None = None
    max_token_len: int | None = None
    real_tokens: bool = False  # the token budget counts real tokens (packed rows), not rows × longest

    def __post_init__(self) -> None:
        if (self.size is None) == (self.max_token_len is None):
            raise ValueError(
                f"give exactly one of micro-batch size or max_token_len, got size={self.size}, "
                f"max_token_len={self.max_token_len}"
            )
        if self.size is not None and self.size < 1:
            raise ValueError(f"micro-batch size must be >= 1, got {self.size}")
        if self.max_token_len is not None and self.max_token_len < 1:
            raise ValueError(f"max_token_len must be >= 1, got {self.max_token_len}")


def plan_micro_batches(lengths: Sequence[int] | torch.Tensor, spec: MicroBatchSpec) -> list[list[int]]:
    """Row indices of each micro-batch for rows of the given (unpadded) ``lengths``."""
    lengths = [int(n) for n in lengths]
    if not lengths:
        return []
    if spec.size is not None:
        order = _longest_first(lengths)
        return [order[start : start + spec.size] for start in range(0, len(order), spec.size)]
    return _pack_by_tokens(lengths, int(spec.max_token_len), spec.real_tokens)  # type: ignore[arg-type]


def plan_prompt_chunks(
    lengths: Sequence[int] | torch.Tensor, prompt_of: Sequence[int], prompt_tokens: int, spec: MicroBatchSpec | None
) -> list[list[list[int]]]:
    """Rows grouped into chunks of whole prompts, each chunk cut into micro-batches.

    ``prompt_of[i]``: row i's prompt; ``prompt_tokens``: the columns a prompt's shared part
    takes. A chunk's distinct prompts run through the model together, once, and their
    activations stay until the chunk's last micro-batch is done, so a chunk takes no more
    prompts than fill the largest micro-batch ``spec`` allows (``size`` × the longest row,
    or ``max_token_len``): it never holds more activations than one micro-batch. Prompts are
    taken longest row first; inside a chunk the micro-batches are cut as
    :func:`plan_micro_batches` cuts them. ``spec=None``: one chunk, one micro-batch.
    """
    lengths = [int(n) for n in lengths]
    if len(prompt_of) != len(lengths):
        raise ValueError(f"{len(prompt_of)} prompt numbers for {len(lengths)} rows")
    if not lengths:
        return []
    if spec is None:
        return [[list(range(len(lengths)))]]
    rows_of: dict[int, list[int]] = {}
    for row, prompt in enumerate(prompt_of):
        rows_of.setdefault(int(prompt), []).append(row)
    prompts = sorted(rows_of, key=lambda p: (-max(lengths[r] for r in rows_of[p]), rows_of[p][0]))
    budget = spec.max_token_len if spec.max_token_len is not None else spec.size * max(lengths)  # type: ignore[operator]
    per_chunk = max(1, budget // max(prompt_tokens, 1))
    chunks = []
    for start in range(0, len(prompts), per_chunk):
        rows = sorted(r for p in prompts[start : start + per_chunk] for r in rows_of[p])
        plan = plan_micro_batches([lengths[r] for r in rows], spec)
        chunks.append([[rows[i] for i in micro] for micro in plan])
    return chunks


def _longest_first(lengths: list[int]) -> list[int]:
    return sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))


def _pack_by_tokens(lengths: list[int], budget: int, real_tokens: bool = False) -> list[list[int]]:
    longest = max(lengths)
    if longest > budget:
        raise ValueError(
            f"max_token_len ({budget}) is smaller than the longest row ({longest} tokens); "
            "raise the token budget to at least the prompt + response length"
        )
    order = _longest_first(lengths)
    plan: list[list[int]] = []
    current: list[int] = []
    current_max = current_sum = 0
    for i in order:
        new_max = max(current_max, lengths[i])
        cost = current_sum + lengths[i] if real_tokens else (len(current) + 1) * new_max
        if current and cost > budget:
            plan.append(current)
            current, new_max, current_sum = [], lengths[i], 0
        current.append(i)
        current_max = new_max
        current_sum += lengths[i]
    plan.append(current)
    return plan


def split_plan_to(plan: Sequence[Sequence[int]], count: int) -> list[list[int]]:
    """``plan`` with micro-batches halved until there are ``count`` of them.

    The micro-batch with the most rows (the first on ties) is split into its first ⌈n/2⌉ and
    last ⌊n/2⌋ rows, in place in the plan, so row order and token budgets are kept (a part
    never holds more tokens than the whole). ``count`` must lie between ``len(plan)`` and the
    number of rows.
    """
    out = [list(micro) for micro in plan]
    rows = sum(len(micro) for micro in out)
    if not len(out) <= count <= rows:
        raise ValueError(f"cannot turn a plan of {len(out)} micro-batches over {rows} rows into {count} micro-batches")
    while len(out) < count:
        k = max(range(len(out)), key=lambda i: (len(out[i]), -i))
        micro = out[k]
        half = (len(micro) + 1) // 2
        out[k : k + 1] = [micro[:half], micro[half:]]
    return out


def restore_order(parts: Sequence[torch.Tensor], plan: Sequence[Sequence[int]]) -> torch.Tensor:
    """Concatenate per-micro-batch outputs and put rows back in batch order.

    ``parts[k]`` holds the rows ``plan[k]`` (first dimension), in that order.
    """
    if len(parts) != len(plan):
        raise ValueError(f"{len(parts)} output parts for a plan of {len(plan)} micro-batches")
    flat = [i for micro in plan for i in micro]
    joined = torch.cat(list(parts), dim=0)
    inverse = torch.empty(len(flat), dtype=torch.long)
    inverse[torch.tensor(flat, dtype=torch.long)] = torch.arange(len(flat))
    return joined[inverse.to(joined.device)]
