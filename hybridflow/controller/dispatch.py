"""Dispatch modes: how a worker-group call is split across ranks and how outputs merge.

Each mode is a pair of small pure functions (verl's names and semantics, API.md §2):

* ``dispatch_fn(ctx, *args, **kwargs) -> Dispatched`` turns the controller's arguments into
  one argument tuple per rank (``Dispatched.args[i][r]`` is positional argument ``i`` for
  rank ``r``);
* ``collect_fn(ctx, outputs) -> result`` merges the list of per-rank outputs.

``ctx`` is a :class:`DispatchContext` (world size and mesh layout), never the group
itself, so a collect function can travel inside a ``DataProtoFuture`` to another process.

| mode | driver → workers | workers → driver |
|---|---|---|
| ONE_TO_ALL | every argument replicated | list of all outputs |
| ALL_TO_ALL | per rank if every argument is a list of world_size, else replicated | list |
| RANK_ZERO | replicated; only rank 0 runs (see ``register``) | rank 0's output |
| DP_COMPUTE | every argument already a list/tuple of world_size | list |
| DP_COMPUTE_PROTO | every DataProto/future chunked (auto-padded if enabled) | concat, pad removed |
| DP_COMPUTE_PROTO_WITH_FUNC | first argument (a function) replicated, rest chunked | as above |
| DP_COMPUTE_METRIC | as DP_COMPUTE_PROTO | list |
| nd mesh (``make_nd_compute_dataproto_dispatch_fn``) | chunk ``dp_rank`` of each rank | concat of collector ranks |

New modes are added by name with :func:`register_dispatch_mode`.
"""

from __future__ import annotations

import enum
import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from hybridflow.protocol import DataProto, DataProtoFuture, pad_dataproto_to_divisor, unpad_dataproto
from hybridflow.utils.registry import Registry

__all__ = [
    "Dispatch",
    "DispatchContext",
    "DispatchMode",
    "Dispatched",
    "MeshRank",
    "DISPATCH_MODES",
    "register_dispatch_mode",
    "resolve_dispatch_mode",
    "make_nd_compute_dataproto_dispatch_fn",
    "finish_collect",
    "run_dispatch",
    "dispatch_one_to_all",
    "dispatch_all_to_all",
    "dispatch_dp_compute",
    "dispatch_dp_compute_data_proto",
    "dispatch_dp_compute_data_proto_with_func",
    "dispatch_nd_compute_data_proto",
    "collect_all",
    "collect_rank_zero",
    "collect_dp_compute_data_proto",
    "collect_nd_compute_data_proto",
]


class Dispatch(str, enum.Enum):
    """Built-in dispatch modes (verl's names); the value is the registry name."""

    ONE_TO_ALL = "ONE_TO_ALL"
    ALL_TO_ALL = "ALL_TO_ALL"
    RANK_ZERO = "RANK_ZERO"
    DP_COMPUTE = "DP_COMPUTE"
    DP_COMPUTE_PROTO = "DP_COMPUTE_PROTO"
    DP_COMPUTE_PROTO_WITH_FUNC = "DP_COMPUTE_PROTO_WITH_FUNC"
    DP_COMPUTE_METRIC = "DP_COMPUTE_METRIC"


@dataclass(frozen=True)
class MeshRank:
    """Where one rank sits in a named mesh: its data-parallel rank and whether its output is kept."""

    dp_rank: int
    is_collect: bool


@dataclass(frozen=True)
class DispatchContext:
    """What dispatch/collect functions may know about the group (picklable, no handles).

    ``meshes[name][r]`` is rank ``r``'s :class:`MeshRank` in mesh ``name``.
    """

    world_size: int
    meshes: Mapping[str, tuple[MeshRank, ...]] = field(default_factory=dict)

    def mesh(self, name: str) -> tuple[MeshRank, ...]:
        if name not in self.meshes:
            raise ValueError(f"no dispatch info for mesh {name!r}; known meshes: {sorted(self.meshes) or 'none'}")
        return self.meshes[name]


@dataclass(frozen=True)
class Dispatched:
    """Per-rank arguments: ``args[i][r]`` / ``kwargs[k][r]`` go to rank ``r``.

    ``pad_size`` rows were appended by auto-padding; :func:`finish_collect` removes them.
    """

    args: tuple[list[Any], ...]
    kwargs: dict[str, list[Any]]
    pad_size: int = 0

    def for_rank(self, rank: int) -> tuple[tuple[Any, ...], dict[str, Any]]:
        return tuple(a[rank] for a in self.args), {k: v[rank] for k, v in self.kwargs.items()}

    def check(self, world_size: int) -> Dispatched:
        """Raise unless every argument has exactly one entry per rank."""
        named = [(f"positional argument {i}", a) for i, a in enumerate(self.args)]
        named += [(f"keyword argument {k!r}", v) for k, v in self.kwargs.items()]
        for what, per_rank in named:
            if not isinstance(per_rank, list | tuple) or len(per_rank) != world_size:
                got = len(per_rank) if isinstance(per_rank, list | tuple) else type(per_rank).__name__
                raise ValueError(
                    f"dispatch produced {got} entries for {what}; expected a list of {world_size} (one per rank)"
                )
        return self


DispatchFn = Callable[..., Dispatched | tuple[Any, Any]]
CollectFn = Callable[[DispatchContext, list[Any]], Any]


@dataclass(frozen=True)
class DispatchMode:
    """A dispatch/collect pair; ``mesh_name`` set when dispatch needs that mesh's layout."""

    dispatch_fn: DispatchFn
    collect_fn: CollectFn
    mesh_name: str | None = None


# --- the built-in pairs -----------------------------------------------------------------------


def dispatch_one_to_all(ctx: DispatchContext, *args: Any, **kwargs: Any) -> Dispatched:
    """Every argument replicated to each rank."""
    n = ctx.world_size
    return Dispatched(tuple([a] * n for a in args), {k: [v] * n for k, v in kwargs.items()})


def dispatch_all_to_all(ctx: DispatchContext, *args: Any, **kwargs: Any) -> Dispatched:
    """Per rank when every argument is a ``list`` of exactly world_size entries, else replicated."""
    values = list(args) + list(kwargs.values())
    per_rank = bool(values) and all(isinstance(v, list) and len(v) == ctx.world_size for v in values)
    if not per_rank:
        return dispatch_one_to_all(ctx, *args, **kwargs)
    return Dispatched(tuple(list(a) for a in args), {k: list(v) for k, v in kwargs.items()})


def dispatch_dp_compute(ctx: DispatchContext, *args: Any, **kwargs: Any) -> Dispatched:
    """Arguments are already lists (or tuples) of world_size entries; anything else is an error."""
    plan = Dispatched(tuple(args), dict(kwargs)).check(ctx.world_size)
    return Dispatched(tuple(list(a) for a in plan.args), {k: list(v) for k, v in plan.kwargs.items()})


def collect_all(ctx: DispatchContext, outputs: list[Any]) -> list[Any]:
    """The list of outputs, one per rank that ran."""
    return list(outputs)


def collect_rank_zero(ctx: DispatchContext, outputs: list[Any]) -> Any:
    """The first (rank 0's) output."""
    if not outputs:
        raise ValueError("collect_rank_zero: no output to collect")
    return outputs[0]


def _split_protos(n_chunks: int, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Dispatched:
    """Chunk every DataProto / DataProtoFuture argument into ``n_chunks`` parts.

    If any DataProto has auto-padding on and its length does not divide, all DataProto
    arguments (which must then have equal lengths) are padded with
    :func:`pad_dataproto_to_divisor` first; the pad size is recorded in the result.
    """
    named = [(f"positional argument {i}", a) for i, a in enumerate(args)] + [
        (f"keyword argument {k!r}", v) for k, v in kwargs.items()
    ]
    for what, value in named:
        if not isinstance(value, DataProto | DataProtoFuture):
            raise TypeError(
                f"a DP_COMPUTE_PROTO-style call splits every argument, but {what} is a {type(value).__name__}; "
                "pass only DataProto/DataProtoFuture arguments (put scalars in meta_info)"
            )
    pad_size = _common_pad_size(n_chunks, named)
    chunked = [_chunk_one(n_chunks, what, value, pad_size) for what, value in named]
    positional = tuple(chunked[: len(args)])
    return Dispatched(positional, dict(zip(kwargs, chunked[len(args) :])), pad_size)


def _common_pad_size(n_chunks: int, named: list[tuple[str, Any]]) -> int:
    protos = [(what, v) for what, v in named if isinstance(v, DataProto)]
    if not any(v.is_padding_enabled() for _, v in protos):
        return 0
    lengths = {len(v) for _, v in protos}
    if len(lengths) > 1:
        detail = ", ".join(f"{what}: {len(v)} rows" for what, v in protos)
        raise ValueError(f"auto-padding needs DataProto arguments of equal length, got {detail}")
    pad_size = (-lengths.pop()) % n_chunks
    futures = [what for what, v in named if isinstance(v, DataProtoFuture)]
    if pad_size and futures:
        raise ValueError(
            f"auto-padding cannot pad a DataProtoFuture ({', '.join(futures)}); resolve it with .get() first"
        )
    return pad_size


def _chunk_one(n_chunks: int, what: str, value: DataProto | DataProtoFuture, pad_size: int) -> list[Any]:
    if isinstance(value, DataProtoFuture):
        return value.chunk(n_chunks)
    if pad_size:
        value, _ = pad_dataproto_to_divisor(value, n_chunks)
    elif len(value) % n_chunks:
        raise ValueError(
            f"{what} has {len(value)} rows, which does not divide into {n_chunks} data-parallel parts; "
            "enable auto-padding (DataProto.from_dict(..., auto_padding=True)) or pad with pad_dataproto_to_divisor"
        )
    return value.chunk(n_chunks)


def dispatch_dp_compute_data_proto(ctx: DispatchContext, *args: Any, **kwargs: Any) -> Dispatched:
    """Every DataProto/DataProtoFuture argument chunked into world_size parts."""
    return _split_protos(ctx.world_size, args, kwargs)


def dispatch_dp_compute_data_proto_with_func(
    ctx: DispatchContext, func: Callable[..., Any], *args: Any, **kwargs: Any
) -> Dispatched:
    """The first argument (a function) replicated to each rank, the rest chunked."""
    if not callable(func):
        raise TypeError(
            f"DP_COMPUTE_PROTO_WITH_FUNC expects a function as its first argument, got {type(func).__name__}"
        )
    split = _split_protos(ctx.world_size, args, kwargs)
    return Dispatched(([func] * ctx.world_size, *split.args), split.kwargs, split.pad_size)


def collect_dp_compute_data_proto(ctx: DispatchContext, outputs: list[Any]) -> DataProto:
    """``DataProto.concat`` of the per-rank outputs (all must be DataProto)."""
    for rank, out in enumerate(outputs):
        if not isinstance(out, DataProto):
            raise TypeError(
                f"a DP_COMPUTE_PROTO-style method must return a DataProto, but output {rank} is a {type(out).__name__}"
            )
    return DataProto.concat(outputs)


# --- mesh-aware dispatch ------------------------------------------------------------------------


def _dp_size(ctx: DispatchContext, mesh_name: str) -> int:
    ranks = ctx.mesh(mesh_name)
    if len(ranks) != ctx.world_size:
        raise ValueError(f"mesh {mesh_name!r} describes {len(ranks)} ranks but the group has {ctx.world_size}")
    dp_ranks = sorted({r.dp_rank for r in ranks})
    if dp_ranks != list(range(len(dp_ranks))):
        raise ValueError(f"mesh {mesh_name!r}: dp ranks must be 0..n-1, got {dp_ranks}")
    return len(dp_ranks)


def dispatch_nd_compute_data_proto(mesh_name: str, ctx: DispatchContext, *args: Any, **kwargs: Any) -> Dispatched:
    """Chunk into dp_size parts; rank ``r`` gets chunk ``dp_rank(r)`` (TP/SP peers share a chunk)."""
    split = _split_protos(_dp_size(ctx, mesh_name), args, kwargs)
    dp_of = [r.dp_rank for r in ctx.mesh(mesh_name)]
    return Dispatched(
        tuple([a[d] for d in dp_of] for a in split.args),
        {k: [v[d] for d in dp_of] for k, v in split.kwargs.items()},
        split.pad_size,
    )


def collect_nd_compute_data_proto(mesh_name: str, ctx: DispatchContext, outputs: list[Any]) -> DataProto:
    """Concat, in dp_rank order, the outputs of the collector ranks (exactly one per dp_rank)."""
    dp_size = _dp_size(ctx, mesh_name)
    collectors = sorted((r.dp_rank, rank) for rank, r in enumerate(ctx.mesh(mesh_name)) if r.is_collect)
    if [d for d, _ in collectors] != list(range(dp_size)):
        raise ValueError(
            f"mesh {mesh_name!r} needs exactly one collector rank per dp rank 0..{dp_size - 1}, got {collectors}"
        )
    return collect_dp_compute_data_proto(ctx, [outputs[rank] for _, rank in collectors])


def make_nd_compute_dataproto_dispatch_fn(mesh_name: str) -> DispatchMode:
    """Mesh-aware DP dispatch for ``register(dispatch_mode=...)``.

    Workers declare their place with ``Worker.set_dispatch_info(mesh_name, dp_rank, is_collect)``;
    the group asks them once and caches the layout.
    """
    return DispatchMode(
        dispatch_fn=functools.partial(dispatch_nd_compute_data_proto, mesh_name),
        collect_fn=functools.partial(collect_nd_compute_data_proto, mesh_name),
        mesh_name=mesh_name,
    )


# --- finishing, registry, resolution -----------------------------------------------------------


def finish_collect(collect_fn: CollectFn, ctx: DispatchContext, pad_size: int, outputs: list[Any]) -> Any:
    """``collect_fn(ctx, outputs)`` with auto-padding rows removed from a DataProto result."""
    result = collect_fn(ctx, list(outputs))
    if pad_size and isinstance(result, DataProto):
        return unpad_dataproto(result, pad_size)
    return result


DISPATCH_MODES: Registry[DispatchMode] = Registry("dispatch mode")


def register_dispatch_mode(name: str | Dispatch, dispatch_fn: DispatchFn, collect_fn: CollectFn) -> DispatchMode:
    """Add a mode usable as ``register(dispatch_mode=name)``; returns the registered pair.

    Registering the same pair again is a no-op; a different pair under a taken name raises.
    """
    mode = DispatchMode(dispatch_fn=dispatch_fn, collect_fn=collect_fn)
    if name in DISPATCH_MODES and DISPATCH_MODES.get(name) == mode:
        return DISPATCH_MODES.get(name)
    DISPATCH_MODES.add(name, mode)
    return mode


register_dispatch_mode(Dispatch.ONE_TO_ALL, dispatch_one_to_all, collect_all)
register_dispatch_mode(Dispatch.ALL_TO_ALL, dispatch_all_to_all, collect_all)
register_dispatch_mode(Dispatch.RANK_ZERO, dispatch_one_to_all, collect_rank_zero)
register_dispatch_mode(Dispatch.DP_COMPUTE, dispatch_dp_compute, collect_all)
register_dispatch_mode(Dispatch.DP_COMPUTE_PROTO, dispatch_dp_compute_data_proto, collect_dp_compute_data_proto)
register_dispatch_mode(
    Dispatch.DP_COMPUTE_PROTO_WITH_FUNC, dispatch_dp_compute_data_proto_with_func, collect_dp_compute_data_proto
)
register_dispatch_mode(Dispatch.DP_COMPUTE_METRIC, dispatch_dp_compute_data_proto, collect_all)


def resolve_dispatch_mode(mode: Dispatch | str | DispatchMode | Mapping[str, Any]) -> DispatchMode:
    """A registered name/enum, a :class:`DispatchMode`, or verl's ``{"dispatch_fn", "collect_fn"}`` dict."""
    if isinstance(mode, DispatchMode):
        return mode
    if isinstance(mode, Mapping):
        missing = {"dispatch_fn", "collect_fn"} - set(mode)
        extra = set(mode) - {"dispatch_fn", "collect_fn"}
        if missing or extra:
            raise ValueError(
                "a custom dispatch mode is a dict with exactly 'dispatch_fn' and 'collect_fn'; "
                f"missing {sorted(missing)}, unexpected {sorted(extra)}"
            )
        for key in ("dispatch_fn", "collect_fn"):
            if not callable(mode[key]):
                raise TypeError(f"custom dispatch mode: {key} must be callable, got {type(mode[key]).__name__}")
        return DispatchMode(dispatch_fn=mode["dispatch_fn"], collect_fn=mode["collect_fn"])
    if isinstance(mode, str | Dispatch):
        return DISPATCH_MODES.get(mode)
    raise TypeError(
        f"dispatch_mode must be a Dispatch, a registered name, a DispatchMode or a dict; got {type(mode).__name__}"
    )


def run_dispatch(mode: DispatchMode, ctx: DispatchContext, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Dispatched:
    """Call ``mode.dispatch_fn`` and check its result; verl-style ``(args, kwargs)`` tuples are accepted."""
    result = mode.dispatch_fn(ctx, *args, **kwargs)
    if isinstance(result, tuple) and len(result) == 2:
        result = Dispatched(tuple(result[0]), dict(result[1]))
    if not isinstance(result, Dispatched):
        raise TypeError(
            f"dispatch function {mode.dispatch_fn!r} returned {type(result).__name__}; "
            "expected Dispatched or (args, kwargs)"
        )
    return result.check(ctx.world_size)
