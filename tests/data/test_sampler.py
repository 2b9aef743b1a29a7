from __future__ import annotations

import pytest
import torch

from hybridflow.data import StatefulDataLoader, StatefulSampler


class Rows:
    """A dataset whose row i is {"i": tensor(i)}."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict:
        return {"i": torch.tensor(i)}


def _ids(batch) -> list[int]:
    return batch["i"].tolist()


def _run(loader: StatefulDataLoader, num_batches: int) -> list[list[int]]:
    out = []
    while len(out) < num_batches:
        for batch in loader:
            out.append(_ids(batch))
            if len(out) == num_batches:
                break
    return out


def test_order_depends_only_on_seed_and_epoch():
    a, b = StatefulSampler(10, seed=3), StatefulSampler(10, seed=3)
    torch.manual_seed(123)  # the global RNG must not matter
    assert a.order(0) == b.order(0) == torch.randperm(10, generator=torch.Generator().manual_seed(3)).tolist()
    assert a.order(1) == torch.randperm(10, generator=torch.Generator().manual_seed(4)).tolist()
    assert sorted(a.order(0)) == list(range(10)) and a.order(0) != a.order(1)
    assert StatefulSampler(4, shuffle=False).order(7) == [0, 1, 2, 3]


def test_sampler_iterates_one_epoch_then_advances():
    sampler = StatefulSampler(5, shuffle=False)
    assert list(sampler) == [0, 1, 2, 3, 4]
    assert (sampler.epoch, sampler.position) == (1, 0)


def test_no_shuffle_batches_and_drop_last():
    loader = StatefulDataLoader(Rows(7), 3, shuffle=False)
    assert len(loader) == 2
    assert [_ids(b) for b in loader] == [[0, 1, 2], [3, 4, 5]]  # row 6 is dropped
    assert loader.epoch == 1
    keep = StatefulDataLoader(Rows(7), 3, shuffle=False, drop_last=False)
    assert len(keep) == 3 and [_ids(b) for b in keep][-1] == [6]


@pytest.mark.parametrize("stop_after", [1, 3, 4, 6])  # mid-epoch, at the epoch end, in epoch 2
def test_resume_continues_at_the_same_row(stop_after):
    reference = _run(StatefulDataLoader(Rows(10), 3, seed=7), 9)
    first = StatefulDataLoader(Rows(10), 3, seed=7)
    head = _run(first, stop_after)
    state = first.state_dict()
    resumed = StatefulDataLoader(Rows(10), 3, seed=7)
    resumed.load_state_dict(state)
    assert head + _run(resumed, 9 - stop_after) == reference


def test_state_at_epoch_end_points_to_next_epoch():
    loader = StatefulDataLoader(Rows(6), 3, seed=0)
    _run(loader, 2)  # the whole first epoch, loop broken right after the last batch
    state = loader.state_dict()
    assert (state["epoch"], state["position"]) == (1, 0)
    assert loader.epoch == 1


def test_mismatched_state_is_refused():
    state = StatefulDataLoader(Rows(10), 2, seed=1).state_dict()
    with pytest.raises(ValueError, match="saved num_rows=10 but this run has num_rows=11"):
        StatefulDataLoader(Rows(11), 2, seed=1).load_state_dict(state)
    with pytest.raises(ValueError, match="saved seed=1 but this run has seed=2"):
        StatefulDataLoader(Rows(10), 2, seed=2).load_state_dict(state)
    with pytest.raises(ValueError, match="saved batch_size=2"):
        StatefulDataLoader(Rows(10), 5, seed=1).load_state_dict(state)


def test_bad_loader_arguments():
    with pytest.raises(ValueError, match="larger than the dataset"):
        StatefulDataLoader(Rows(3), 4)
    with pytest.raises(ValueError, match="batch_size must be positive"):
        StatefulDataLoader(Rows(3), 0)
