"""Dispatch/collect pairs as pure functions: every mode round-trips, padding, custom modes."""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
import pytest
import torch

from hybridflow.controller.dispatch import (
    DISPATCH_MODES,
    Dispatch,
    DispatchContext,
    Dispatched,
    DispatchMode,
    MeshRank,
    collect_all,
    dispatch_one_to_all,
    finish_collect,
    make_nd_compute_dataproto_dispatch_fn,
    register_dispatch_mode,
    resolve_dispatch_mode,
    run_dispatch,
)
from hybridflow.protocol import DataProto, DataProtoFuture

CTX4 = DispatchContext(world_size=4)


def rows(n: int, auto_padding: bool = False) -> DataProto:
    return DataProto.from_dict(
        {"x": torch.arange(n, dtype=torch.float32)}, {"tag": np.arange(n) * 10}, auto_padding=auto_padding
    )


def simulate(
    mode: DispatchMode, ctx: DispatchContext, worker: Any, *args: Any, **kwargs: Any
) -> tuple[Any, Dispatched]:
    """Dispatch, run ``worker(rank, *args, **kwargs)`` per rank, collect (padding removed)."""
    plan = run_dispatch(mode, ctx, args, kwargs)
    outputs = []
    for rank in range(ctx.world_size):
        rank_args, rank_kwargs = plan.for_rank(rank)
        outputs.append(worker(rank, *rank_args, **rank_kwargs))
    return finish_collect(mode.collect_fn, ctx, plan.pad_size, outputs), plan


def identity(rank: int, *args: Any, **kwargs: Any) -> Any:
    return args[0] if args else next(iter(kwargs.values()))


def test_one_to_all_replicates_every_argument() -> None:
    mode = resolve_dispatch_mode(Dispatch.ONE_TO_ALL)
    out, plan = simulate(mode, CTX4, lambda r, a, b, c: (r, a, b, c), 5, [1, 2], c="k")
    assert out == [(0, 5, [1, 2], "k"), (1, 5, [1, 2], "k"), (2, 5, [1, 2], "k"), (3, 5, [1, 2], "k")]
    assert plan.pad_size == 0


def test_all_to_all_splits_per_rank_lists_and_broadcasts_others() -> None:
    mode = resolve_dispatch_mode(Dispatch.ALL_TO_ALL)
    per_rank, _ = simulate(mode, CTX4, lambda r, a, b: (r, a, b), ["a", "b", "c", "d"], b=[0, 1, 2, 3])
    assert per_rank == [(0, "a", 0), (1, "b", 1), (2, "c", 2), (3, "d", 3)]
    # a list of the wrong length, or a mix of list and scalar, is broadcast as it is
    broadcast, _ = simulate(mode, CTX4, lambda r, a, b: (r, a, b), ["a", "b"], b=7)
    assert broadcast == [(r, ["a", "b"], 7) for r in range(4)]


def test_rank_zero_collects_first_output_only() -> None:
    mode = resolve_dispatch_mode(Dispatch.RANK_ZERO)
    out, _ = simulate(mode, CTX4, lambda r, a: a + r, 40)
    assert out == 40


def test_dp_compute_distributes_lists_and_rejects_wrong_lengths() -> None:
    mode = resolve_dispatch_mode(Dispatch.DP_COMPUTE)
    out, _ = simulate(mode, CTX4, lambda r, a: a * (r + 1), [1, 2, 3, 4])
    assert out == [1, 4, 9, 16]
    with pytest.raises(ValueError, match=r"3 entries for positional argument 0; expected a list of 4"):
        simulate(mode, CTX4, identity, [1, 2, 3])
    with pytest.raises(ValueError, match="keyword argument 'x'"):
        simulate(mode, CTX4, identity, x=5)


def test_dp_compute_proto_chunks_and_concats() -> None:
    mode = resolve_dispatch_mode(Dispatch.DP_COMPUTE_PROTO)
    seen: dict[int, list[float]] = {}

    def worker(rank: int, data: DataProto) -> DataProto:
        seen[rank] = data.batch["x"].tolist()
        return DataProto.from_dict({"y": data.batch["x"] + 100 * rank}, {"tag": data.non_tensor_batch["tag"]})

    out, plan = simulate(mode, CTX4, worker, rows(8))
    assert seen == {0: [0.0, 1.0], 1: [2.0, 3.0], 2: [4.0, 5.0], 3: [6.0, 7.0]}
    assert out.batch["y"].tolist() == [0, 1, 102, 103, 204, 205, 306, 307]
    assert out.non_tensor_batch["tag"].tolist() == [0, 10, 20, 30, 40, 50, 60, 70]
    assert plan.pad_size == 0


def test_dp_compute_proto_without_auto_padding_names_the_problem() -> None:
    mode = resolve_dispatch_mode(Dispatch.DP_COMPUTE_PROTO)
    with pytest.raises(
        ValueError, match=r"positional argument 0 has 10 rows, which does not divide into 4.*auto_padding=True"
    ):
        simulate(mode, CTX4, identity, rows(10))
    with pytest.raises(TypeError, match="keyword argument 'scale' is a int"):
        simulate(mode, CTX4, identity, rows(8), scale=3)


@pytest.mark.parametrize("n", list(range(4, 20)))
def test_auto_padding_over_four_ranks_returns_the_original_rows(n: int) -> None:
    mode = resolve_dispatch_mode(Dispatch.DP_COMPUTE_PROTO)
    sizes: list[int] = []

    def worker(rank: int, data: DataProto) -> DataProto:
        sizes.append(len(data))
        return data

    out, plan = simulate(mode, CTX4, worker, rows(n, auto_padding=True))
    assert plan.pad_size == (-n) % 4
    assert sizes == [-(-n // 4)] * 4  # every rank got ceil(n/4) rows
    assert len(out) == n
    assert out.batch["x"].tolist() == list(range(n))
    assert out.non_tensor_batch["tag"].tolist() == [10 * i for i in range(n)]


def test_auto_padding_needs_equal_lengths() -> None:
    mode = resolve_dispatch_mode(Dispatch.DP_COMPUTE_PROTO)
    with pytest.raises(ValueError, match="equal length"):
        simulate(mode, CTX4, identity, rows(5, auto_padding=True), rows(6))


def test_dp_compute_proto_with_func_replicates_the_function() -> None:
    mode = resolve_dispatch_mode(Dispatch.DP_COMPUTE_PROTO_WITH_FUNC)

    def worker(rank: int, fn: Any, data: DataProto) -> DataProto:
        return DataProto.from_dict({"y": fn(data.batch["x"]) + rank})

    out, plan = simulate(mode, CTX4, worker, torch.neg, rows(4))
    assert all(plan.args[0][r] is torch.neg for r in range(4))
    assert out.batch["y"].tolist() == [0.0, 0.0, 0.0, 0.0]  # -x + rank with x = rank
    with pytest.raises(TypeError, match="expects a function"):
        simulate(mode, CTX4, worker, rows(4), rows(4))


def test_dp_compute_metric_returns_the_raw_list() -> None:
    mode = resolve_dispatch_mode(Dispatch.DP_COMPUTE_METRIC)
    out, _ = simulate(mode, CTX4, lambda r, d: {"rank": r, "sum": float(d.batch["x"].sum())}, rows(8))
    assert out == [{"rank": 0, "sum": 1.0}, {"rank": 1, "sum": 5.0}, {"rank": 2, "sum": 9.0}, {"rank": 3, "sum": 13.0}]


def test_dp_compute_proto_chunks_futures_without_resolving_them() -> None:
    mode = resolve_dispatch_mode(Dispatch.DP_COMPUTE_PROTO)
    # outside Ray a future's entries are already values: two "ranks" produced 3 rows each
    future = DataProtoFuture.concat([rows(3), rows(3)])
    plan = run_dispatch(mode, CTX4.__class__(world_size=2), (future,), {})
    parts = [plan.for_rank(r)[0][0] for r in range(2)]
    assert all(isinstance(p, DataProtoFuture) for p in parts)
    assert [p.get().batch["x"].tolist() for p in parts] == [[0.0, 1.0, 2.0], [0.0, 1.0, 2.0]]


# --- mesh-aware dispatch ------------------------------------------------------------------------

TP2 = DispatchContext(
    world_size=4, meshes={"m": (MeshRank(0, True), MeshRank(0, False), MeshRank(1, True), MeshRank(1, False))}
)


def test_nd_dispatch_gives_tp_peers_the_same_chunk_and_collects_collectors_only() -> None:
    mode = make_nd_compute_dataproto_dispatch_fn("m")
    seen: dict[int, list[float]] = {}

    def worker(rank: int, data: DataProto) -> DataProto:
        seen[rank] = data.batch["x"].tolist()
        return DataProto.from_dict({"y": data.batch["x"] + 1000 * rank})

    out, _ = simulate(mode, TP2, worker, rows(6))
    assert seen == {0: [0.0, 1.0, 2.0], 1: [0.0, 1.0, 2.0], 2: [3.0, 4.0, 5.0], 3: [3.0, 4.0, 5.0]}
    assert out.batch["y"].tolist() == [0.0, 1.0, 2.0, 2003.0, 2004.0, 2005.0]
    assert mode.mesh_name == "m"


def test_nd_collect_orders_by_dp_rank_and_checks_collectors() -> None:
    swapped = DispatchContext(world_size=2, meshes={"m": (MeshRank(1, True), MeshRank(0, True))})
    mode = make_nd_compute_dataproto_dispatch_fn("m")
    out, _ = simulate(mode, swapped, lambda r, d: DataProto.from_dict({"y": d.batch["x"] * 0 + r}), rows(4))
    # rank 1 holds dp chunk 0, so its rows come first
    assert out.batch["y"].tolist() == [1.0, 1.0, 0.0, 0.0]
    two_collectors = DispatchContext(world_size=2, meshes={"m": (MeshRank(0, True), MeshRank(0, True))})
    with pytest.raises(ValueError, match="exactly one collector rank per dp rank"):
        simulate(mode, two_collectors, identity, rows(4))
    with pytest.raises(ValueError, match="no dispatch info for mesh 'm'"):
        simulate(mode, CTX4, identity, rows(4))


# --- custom and registered modes ----------------------------------------------------------------


def dispatch_reversed(ctx: DispatchContext, values: list[int]) -> tuple[tuple[list[int]], dict[str, list[Any]]]:
    """verl-style custom dispatch: returns (args, kwargs); rank r gets values[-1 - r]."""
    return (list(reversed(values)),), {}


def collect_sum(ctx: DispatchContext, outputs: list[int]) -> int:
    return sum(outputs)


def test_custom_dict_mode_round_trips() -> None:
    mode = resolve_dispatch_mode({"dispatch_fn": dispatch_reversed, "collect_fn": collect_sum})
    got: dict[int, int] = {}

    def worker(rank: int, v: int) -> int:
        got[rank] = v
        return v * 10

    out, _ = simulate(mode, CTX4, worker, [1, 2, 3, 4])
    assert got == {0: 4, 1: 3, 2: 2, 3: 1}
    assert out == 100
    with pytest.raises(ValueError, match="missing \\['collect_fn'\\]"):
        resolve_dispatch_mode({"dispatch_fn": dispatch_reversed})


def test_register_a_mode_by_name() -> None:
    name = "TEST_SUM_OF_ONE_TO_ALL"
    mode = register_dispatch_mode(name, dispatch_one_to_all, collect_sum)
    assert resolve_dispatch_mode(name) is mode
    assert register_dispatch_mode(name, dispatch_one_to_all, collect_sum) is mode  # same pair again: no-op
    out, _ = simulate(mode, CTX4, lambda r, x: x + r, 1)
    assert out == 1 * 4 + (0 + 1 + 2 + 3)
    with pytest.raises(ValueError, match="already registered"):
        register_dispatch_mode(name, dispatch_one_to_all, collect_all)
    with pytest.raises(ValueError, match="unknown dispatch mode 'NOPE'; valid names: .*DP_COMPUTE_PROTO"):
        resolve_dispatch_mode("NOPE")
    assert set(m.value for m in Dispatch) <= set(DISPATCH_MODES.names())


def test_dispatch_fn_must_return_one_entry_per_rank() -> None:
    bad = DispatchMode(dispatch_fn=lambda ctx, x: ((x,), {}), collect_fn=collect_all)
    with pytest.raises(ValueError, match="expected a list of 4"):
        run_dispatch(bad, CTX4, ([1, 2],), {})
    with pytest.raises(TypeError, match="expected Dispatched or \\(args, kwargs\\)"):
        run_dispatch(DispatchMode(dispatch_fn=lambda ctx: 3, collect_fn=collect_all), CTX4, (), {})


def test_collect_functions_pickle_inside_a_future() -> None:
    import pickle

    collect = functools.partial(finish_collect, resolve_dispatch_mode(Dispatch.DP_COMPUTE_PROTO).collect_fn, TP2, 1)
    future = DataProtoFuture(collect_fn=collect, futures=[rows(2), rows(2)])
    restored = pickle.loads(pickle.dumps(future))
    assert restored.get().batch["x"].tolist() == [0.0, 1.0, 0.0]  # pad row removed
