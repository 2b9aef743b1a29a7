"""Pieces shared by the actor and critic updates: batch sizes, mini-batches, metric reduction.

verl semantics: ``ppo_mini_batch_size`` counts prompts over all ranks, so one optimizer step
consumes ``ppo_mini_batch_size × rollout.n ÷ dp_size`` rows on each rank; a batch is split
into consecutive mini-batches (rows shuffled first when ``shuffle``) and passed over
``ppo_epochs`` times.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Sequence

import torch
from tensordict import TensorDict

from hybridflow import fields as FK
from hybridflow.algorithms.utils import compute_response_mask
from hybridflow.engine.checkpoint import CheckpointFileError, load_torch_data
from hybridflow.engine.micro_batch import MicroBatchSpec

NUM_TOKENS_KEY = "num_tokens"  # per-micro-batch weight, added by loss functions, dropped on reduce


def rows_per_mini_batch(ppo_mini_batch_size: int, rollout_n: int, dp_size: int, owner: str) -> int:
    """Rows one rank trains on per optimizer step: prompts × n ÷ dp_size (must divide)."""
    total = ppo_mini_batch_size * rollout_n
    if total % dp_size:
        raise ValueError(
            f"{owner}.ppo_mini_batch_size × rollout.n = {ppo_mini_batch_size} × {rollout_n} = {total} "
            f"is not divisible by the data-parallel size {dp_size}"
        )
    return total // dp_size


def micro_batch_spec(
    use_dynamic_bsz: bool, micro_batch_size: int, max_token_len: int | None, real_tokens: bool = False
) -> MicroBatchSpec:
    """Token-budget micro-batches when ``use_dynamic_bsz``, else ``micro_batch_size`` rows.
    ``real_tokens``: the model packs rows without padding, so the budget counts real tokens."""
    if use_dynamic_bsz:
        if max_token_len is None:
            raise ValueError("use_dynamic_bsz needs a max token length per micro-batch")
        return MicroBatchSpec(max_token_len=max_token_len, real_tokens=real_tokens)
    return MicroBatchSpec(size=micro_batch_size)


def response_mask_of(batch: TensorDict) -> torch.Tensor:
    """``response_mask`` if present, else the response part of ``attention_mask``."""
    if FK.RESPONSE_MASK in batch.keys():
        return batch[FK.RESPONSE_MASK]
    return compute_response_mask(batch[FK.RESPONSES], batch[FK.ATTENTION_MASK])


def require_fields(batch: TensorDict, names: Iterable[str], what: str) -> None:
    """Raise a KeyError naming every field ``what`` needs that ``batch`` lacks."""
    missing = [n for n in names if n not in batch.keys()]
    if missing:
        raise KeyError(f"{what} needs batch fields {missing}; the batch has {sorted(batch.keys())}")


def iter_mini_batches(
    batch: TensorDict, rows: int, epochs: int, shuffle: bool, generator: torch.Generator
) -> Iterator[TensorDict]:
    """``epochs`` passes of consecutive ``rows``-row mini-batches (a fresh permutation per
    pass when ``shuffle``). The batch size must be a multiple of ``rows``."""
    n = int(batch.batch_size[0])
    if n == 0 or n % rows:
        raise ValueError(
            f"batch of {n} rows cannot be split into mini-batches of {rows} rows "
            "(ppo_mini_batch_size × rollout.n ÷ dp_size must divide the rows each rank receives)"
        )
    for _ in range(epochs):
        order = torch.randperm(n, generator=generator) if shuffle else torch.arange(n)
        for start in range(0, n, rows):
            yield batch[order[start : start + rows]]


def reduce_micro_metrics(
    micro_metrics: Sequence[dict[str, torch.Tensor]], additive: frozenset[str]
) -> dict[str, float]:
    """One mini-batch's metrics from its micro-batches.

    Keys in ``additive`` are each micro-batch's share of a mini-batch quantity (losses
    aggregated with mini-batch normalisers) and are summed; the others are per-token means
    and are averaged weighted by each micro-batch's token count (``num_tokens``). Either way
    the result does not depend on how the mini-batch was split.
    """
    weights = [float(m[NUM_TOKENS_KEY]) for m in micro_metrics]
    total = sum(weights) or 1.0
    keys = [k for k in micro_metrics[0] if k != NUM_TOKENS_KEY]
    out: dict[str, float] = {}
    for key in keys:
        values = [float(m[key]) for m in micro_metrics]
        if key in additive:
            out[key] = sum(values)
        else:
            out[key] = sum(v * w for v, w in zip(values, weights)) / total
    return out


def mean_over_steps(per_step: Sequence[dict[str, float]]) -> dict[str, float]:
    """Average each metric over the optimizer steps of one update call."""
    keys = {k for step in per_step for k in step}
    return {k: sum(s[k] for s in per_step if k in s) / sum(1 for s in per_step if k in s) for k in sorted(keys)}


def shuffle_state_file(path: str, rank: int) -> str:
    return os.path.join(path, f"shuffle_rng_rank_{rank}.pt")


def save_shuffle_state(path: str, rank: int, generator: torch.Generator) -> None:
    """The mini-batch shuffling generator's state (so a resumed run shuffles as an uninterrupted one)."""
    file = shuffle_state_file(path, rank)
    torch.save(generator.get_state(), file + ".tmp")
    os.replace(file + ".tmp", file)


def load_shuffle_state(path: str, rank: int, generator: torch.Generator) -> None:
    file = shuffle_state_file(path, rank)
    if not os.path.isfile(file):
        raise FileNotFoundError(f"checkpoint {path} has no {os.path.basename(file)} (written by save_checkpoint)")
    state = load_torch_data(file)  # weights_only: a planted pickle is refused, never run
    if not isinstance(state, torch.Tensor) or state.dtype != torch.uint8:
        raise CheckpointFileError(file, "is not a random generator state (a uint8 tensor)")
    generator.set_state(state)
