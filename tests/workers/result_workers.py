"""A worker for the result-convention tests (a module, so Ray actors can import it by path)."""

from __future__ import annotations

import numpy as np

from hybridflow.controller import Worker, register
from hybridflow.protocol import DataProto
from hybridflow.workers.data_parallel import DP_COMPUTE_PROTO_WITH_OPTIONS, DP_METRICS
from hybridflow.workers.rollout.base import RolloutOutput
from hybridflow.workers.rollout.worker import DP_ROLLOUT


class ResultsWorker(Worker):
    """The three shapes a data-parallel method returns: metrics only, data computed with an
    option, data and metrics."""

    @register(dispatch_mode=DP_METRICS)
    def train(self, data: DataProto) -> dict[str, float]:
        return {"rank": float(self.rank), "rows": float(len(data)), "sum": float(data.batch["x"].sum())}

    @register(dispatch_mode=DP_COMPUTE_PROTO_WITH_OPTIONS)
    def score(self, data: DataProto, factor: float = 1.0, shift: bool = False) -> DataProto:
        y = data.batch["x"] * factor + (100 * self.rank if shift else 0)
        return DataProto.from_dict({"y": y}, {"who": np.full(len(data), self.rank)})

    @register(dispatch_mode=DP_ROLLOUT)
    def generate(self, data: DataProto) -> RolloutOutput:
        out = DataProto.from_dict({"y": data.batch["x"] + 1}, meta_info={"weight_version": 7})
        return RolloutOutput(out, {"rank": float(self.rank), "rows": float(len(data))})
