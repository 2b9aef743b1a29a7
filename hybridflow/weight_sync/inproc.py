"""``inproc``: bucketed copies into another module or engine of this process."""

from __future__ import annotations

from hybridflow.inference.weight_transfer import iter_weight_buckets
from hybridflow.weight_sync.base import WEIGHT_SYNCS, NamedTensorPairs, SyncReport, WeightSync


@WEIGHT_SYNCS.register("inproc")
class InprocSync(WeightSync):
    """Stages bucket after bucket on the target (each checked and copied to its device and
    dtype as it comes), then swaps them all in. Only one bucket of the sender's tensors is
    referenced at a time (e.g. one bucket of FSDP-gathered full tensors)."""

    name = "inproc"

    def _deliver(self, named_tensors: NamedTensorPairs, version: int, report: SyncReport) -> None:
        staged = {}
        for bucket in iter_weight_buckets(named_tensors, self.bucket_bytes):
            staged.update(self.target.stage(bucket))
            report.buckets += 1
        if not staged:
            raise ValueError("weight sync 'inproc' got no tensors")
        self.target.swap_in(staged, version)
