"""``shared``: the rollout samples from the actor's live module; nothing is copied."""

from __future__ import annotations

from hybridflow.weight_sync.base import WEIGHT_SYNCS, NamedTensorPairs, SyncReport, WeightSync


@WEIGHT_SYNCS.register("shared")
class SharedSync(WeightSync):
    """Checks that the pairs are the target module's own tensors (the same storage), reads
    none of them, and stamps the version. A pair that is not — a sharded actor's gathered
    tensor, a LoRA merge — means the module is not shared after all: an error, not a copy."""

    name = "shared"

    def _deliver(self, named_tensors: NamedTensorPairs, version: int, report: SyncReport) -> None:
        own = {t.data_ptr() for t in self.target.module.state_dict(keep_vars=True).values()}
        for name, tensor in named_tensors:
            if tensor.data_ptr() not in own:
                raise ValueError(
                    f"weight sync 'shared': {name!r} is not the rollout module's own tensor (a sharded or LoRA "
                    "actor yields copies); use checkpoint_engine.backend=inproc"
                )
        report.bytes = 0  # nothing moved
        self.target.stamp(version)
