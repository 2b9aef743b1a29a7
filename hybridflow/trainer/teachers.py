"""Phase 4b with several teachers: each row is scored by the teacher of its data source.

verl's layout (``distillation.teacher_models.<name>.key``): a row goes to the teacher whose
``key`` equals the row's data source (the ``data.reward_fn_key`` column). One teacher without a
key scores every row. A data source that no teacher claims is an error, not a fallback to some
teacher: that would distil a task from a teacher never meant for it, silently.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from hybridflow.config.distillation import DistillationConfig
from hybridflow.protocol import DataProto, pad_dataproto_to_divisor, unpad_dataproto


@dataclass(frozen=True)
class TeacherRoute:
    """One teacher: its name, the data source it scores (None: every row) and its worker group
    (anything with ``compute_teacher_log_prob(DataProto) -> DataProto`` and ``world_size``)."""

    name: str
    key: str | None
    group: Any


def teacher_routes(dist: DistillationConfig, groups: dict[str, Any]) -> list[TeacherRoute]:
    """The routes of a resolved ``dist``, in the order of ``teacher_models``, over the worker
    groups ``{name: group}`` (a teacher without one gets None: routing only, no scoring)."""
    return [TeacherRoute(name, t.key, groups.get(name)) for name, t in dist.teacher_models.items()]


def route_rows(sources: Sequence[Any] | np.ndarray, routes: Sequence[TeacherRoute]) -> list[np.ndarray]:
    """Row positions for each route, in route order (``sources``: each row's data source).
    Raises ValueError for a data source that matches no teacher's key, naming it and the keys."""
    if len(routes) == 1 and routes[0].key is None:
        return [np.arange(len(sources))]
    column = np.asarray([str(s) for s in sources], dtype=object)
    parts = [np.flatnonzero(column == route.key) for route in routes]
    claimed = np.zeros(len(column), dtype=bool)
    for part in parts:
        claimed[part] = True
    if not claimed.all():
        unknown = sorted(set(column[~claimed].tolist()))
        keys = ", ".join(repr(r.key) for r in routes)
        raise ValueError(
            f"distillation: rows of data source {', '.join(map(repr, unknown))} match no teacher; the teachers' "
            f"keys (distillation.teacher_models.<name>.key) are {keys}: add a teacher with that key"
        )
    return parts


class TeacherGroups:
    """The teachers of a run as one handle for phase 4b: ``compute_teacher_log_prob`` splits the
    batch by teacher, calls each teacher's group on its rows and puts the rows back in order."""

    def __init__(self, routes: Sequence[TeacherRoute], source_key: str) -> None:
        if not routes:
            raise ValueError("TeacherGroups needs at least one teacher")
        self.routes = list(routes)
        self.source_key = source_key

    @property
    def groups(self) -> list[Any]:
        """Each teacher's worker group, in route order (for calls every teacher gets)."""
        return [route.group for route in self.routes]

    def compute_teacher_log_prob(self, batch: DataProto) -> DataProto:
        """Each row's teacher log-probs (and top-K), rows in the order of ``batch``."""
        sources = batch.non_tensor_batch.get(self.source_key)
        if sources is None and (len(self.routes) > 1 or self.routes[0].key is not None):
            raise ValueError(
                f"distillation: routing rows to teachers reads the data source column {self.source_key!r} "
                "(data.reward_fn_key), which this batch lacks"
            )
        parts = route_rows(sources if sources is not None else [None] * len(batch), self.routes)
        used = [(route, rows) for route, rows in zip(self.routes, parts, strict=True) if len(rows)]
        if not used or len(used[0][1]) == len(batch):  # one teacher for every row: the batch as is
            return (used[0][0] if used else self.routes[0]).group.compute_teacher_log_prob(batch)
        outputs = [_score(route.group, batch.select_idxs(rows)) for route, rows in used]
        order = np.concatenate([rows for _, rows in used])
        back = np.empty_like(order)
        back[order] = np.arange(len(order))
        return DataProto.concat(outputs).select_idxs(back)


def _score(group: Any, rows: DataProto) -> DataProto:
    """``group.compute_teacher_log_prob`` on ``rows``, padded to a multiple of its ranks (a
    teacher's share of a batch need not divide evenly) and the padding dropped again."""
    padded, pad = pad_dataproto_to_divisor(rows, int(getattr(group, "world_size", 1)))
    return unpad_dataproto(group.compute_teacher_log_prob(padded), pad)
