"""``disk``: the weights as safetensors files in a folder, loaded by the target from there.

For a rollout that shares a file system but no memory or socket with the trainer. Each sync
writes ``<dir>/v<version>/model-<k>.safetensors`` (one file per bucket, written to a temporary
name and renamed, so a reader never sees half a file), has the target load the folder (it
checks every file before copying anything), then removes the folders of older versions.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from hybridflow.inference.weight_transfer import bucket_to_bytes, iter_weight_buckets
from hybridflow.weight_sync.base import WEIGHT_SYNCS, NamedTensorPairs, SyncReport, WeightSync


@WEIGHT_SYNCS.register("disk")
class DiskSync(WeightSync):
    """``dir``: where version folders go (default: a temporary folder removed by :meth:`close`).
    The target is anything with ``load_folder(folder, version)`` (a
    :class:`~hybridflow.weight_sync.targets.ModuleTarget` / ``EngineTarget``, or an
    :class:`~hybridflow.weight_sync.http.HttpFolderTarget` for a server's weights root)."""

    name = "disk"

    def __init__(self, target: Any, bucket_bytes: int, dir: str | os.PathLike | None = None) -> None:  # noqa: A002
        super().__init__(target, bucket_bytes)
        self._own_dir = dir is None
        self.dir = Path(tempfile.mkdtemp(prefix="hybridflow-weights-") if dir is None else dir)
        self.dir.mkdir(parents=True, exist_ok=True)

    def _deliver(self, named_tensors: NamedTensorPairs, version: int, report: SyncReport) -> None:
        folder = self.dir / f"v{version}"
        if folder.exists():
            shutil.rmtree(folder)
        folder.mkdir(parents=True)
        for index, bucket in enumerate(iter_weight_buckets(named_tensors, self.bucket_bytes)):
            path = folder / f"model-{index:05d}.safetensors"
            partial = path.with_suffix(".partial")
            partial.write_bytes(bucket_to_bytes(bucket))
            os.replace(partial, path)
            report.buckets += 1
        self.target.load_folder(folder, version)
        for old in self.dir.glob("v*"):
            if old != folder and old.is_dir():
                shutil.rmtree(old, ignore_errors=True)

    def close(self) -> None:
        if self._own_dir:
            shutil.rmtree(self.dir, ignore_errors=True)
