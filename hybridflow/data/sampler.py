"""A resumable sampler and batch loader: the saved state is the exact (epoch, row) position.

Epoch ``e`` visits rows in ``randperm(N, seed + e)`` order (or ``0..N-1`` without shuffle),
so the order depends only on ``(seed, epoch)`` — never on the global RNG — and a run that
is stopped after any batch and resumed from :meth:`StatefulDataLoader.state_dict` yields the
same following batches as one that never stopped.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.utils.data import Dataset, Sampler

from hybridflow.data.collate import collate_fn as default_collate
from hybridflow.utils.errors import InputError


class DataSizeError(InputError, ValueError):
    """The data holds fewer rows than one batch needs."""


class StatefulSampler(Sampler[int]):
    """Row indices of one epoch at a time, resumable at the row.

    ``epoch`` is the current epoch; ``position`` counts rows of that epoch already handed out.
    Iterating yields the rest of the current epoch and then moves to the next one. Under
    torch's ``DataLoader`` use ``num_workers=0``: worker prefetching would move the position
    ahead of the batches actually consumed.
    """

    def __init__(self, num_rows: int, *, shuffle: bool = True, seed: int = 0) -> None:
        if num_rows < 1:
            raise ValueError(f"num_rows must be positive, got {num_rows}")
        self.num_rows = num_rows
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = 0
        self.position = 0
        self._cached: tuple[int, list[int]] | None = None  # (epoch, order): one permutation per epoch

    def order(self, epoch: int) -> list[int]:
        """The row order of ``epoch``."""
        if self._cached is not None and self._cached[0] == epoch:
            return self._cached[1]
        if self.shuffle:
            generator = torch.Generator().manual_seed(self.seed + epoch)
            order = torch.randperm(self.num_rows, generator=generator).tolist()
        else:
            order = list(range(self.num_rows))
        self._cached = (epoch, order)
        return order

    def take(self, count: int) -> list[int]:
        """The next ``count`` indices of the current epoch (fewer at its end), advancing the position."""
        indices = self.order(self.epoch)[self.position : self.position + count]
        self.position += len(indices)
        return indices

    def next_epoch(self) -> None:
        self.epoch += 1
        self.position = 0

    def __iter__(self) -> Iterator[int]:
        while self.position < self.num_rows:
            yield from self.take(1)
        self.next_epoch()

    def __len__(self) -> int:
        return self.num_rows

    def state_dict(self) -> dict[str, Any]:
        """Plain ints and bools only: checkpoints store it as JSON."""
        return {
            "epoch": int(self.epoch),
            "position": int(self.position),
            "num_rows": int(self.num_rows),
            "shuffle": bool(self.shuffle),
            "seed": int(self.seed),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        _require_ints(state, ("epoch", "position", "num_rows", "seed"))
        for key in ("num_rows", "shuffle", "seed"):
            if state[key] != getattr(self, key):
                raise ValueError(
                    f"cannot resume the data position: saved {key}={state[key]!r} but this run has "
                    f"{key}={getattr(self, key)!r} (a different dataset or data settings)"
                )
        if not 0 <= state["position"] <= self.num_rows:
            raise ValueError(f"saved data position {state['position']} is outside 0..{self.num_rows}")
        if state["epoch"] < 0:
            raise ValueError(f"saved data epoch {state['epoch']} is negative")
        self.epoch = int(state["epoch"])
        self.position = int(state["position"])


def _require_ints(state: Any, keys: tuple[str, ...]) -> None:
    """A saved position must hold these keys as integers (it comes from a file)."""
    if not isinstance(state, dict):
        raise ValueError(f"saved data position must be a mapping, found {type(state).__name__}")
    for key in keys:
        value = state.get(key)
        if not isinstance(value, int) or isinstance(value, bool):
            raise ValueError(f"saved data position: {key} must be an integer, found {value!r}")


class StatefulDataLoader:
    """Batches of ``batch_size`` rows, collated; ``iter()`` runs to the end of the current epoch.

    With ``drop_last`` (the default, as for RL training) a last short batch is skipped and the
    epoch ends there. ``state_dict()`` after receiving batch *k* resumes at batch *k + 1*;
    a position at the end of an epoch is saved as the start of the next one.

    Typical loop::

        while loader.epoch < total_epochs:
            for batch_dict in loader:     # continues where the loader stands
                ...
    """

    def __init__(
        self,
        dataset: Dataset,
        batch_size: int,
        *,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = True,
        collate_fn: Callable[[list[Any]], Any] = default_collate,
    ) -> None:
        num_rows = len(dataset)  # type: ignore[arg-type]
        if batch_size < 1:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        if drop_last and batch_size > num_rows:
            raise DataSizeError(
                f"batch_size={batch_size} is larger than the dataset ({num_rows} rows) with drop_last: "
                "no batch would ever be produced"
            )
        self.dataset = dataset
        self.batch_size = batch_size
        self.drop_last = drop_last
        self.collate_fn = collate_fn
        self.sampler = StatefulSampler(num_rows, shuffle=shuffle, seed=seed)

    @property
    def epoch(self) -> int:
        """The epoch the next batch comes from."""
        return self.sampler.epoch + (1 if self._epoch_exhausted() else 0)

    def _epoch_rows(self) -> int:
        n = self.sampler.num_rows
        return n - n % self.batch_size if self.drop_last else n

    def _epoch_exhausted(self) -> bool:
        return self.sampler.position >= self._epoch_rows()

    def __len__(self) -> int:
        """Batches per epoch."""
        return -(-self._epoch_rows() // self.batch_size)

    def __iter__(self) -> Iterator[Any]:
        if self._epoch_exhausted():
            self.sampler.next_epoch()
        while not self._epoch_exhausted():
            indices = self.sampler.take(self.batch_size)
            yield self.collate_fn([self.dataset[i] for i in indices])
        self.sampler.next_epoch()

    def state_dict(self) -> dict[str, Any]:
        state = self.sampler.state_dict()
        if self._epoch_exhausted():
            state["epoch"], state["position"] = state["epoch"] + 1, 0
        state["batch_size"] = int(self.batch_size)
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        _require_ints(state, ("batch_size",))
        if state["batch_size"] != self.batch_size:
            raise ValueError(
                f"cannot resume the data position: saved batch_size={state['batch_size']} but this run has "
                f"batch_size={self.batch_size}"
            )
        self.sampler.load_state_dict(state)
