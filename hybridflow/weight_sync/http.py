"""``http``: safetensors buckets posted to a ``hybridflow serve --control-routes`` process."""

from __future__ import annotations

from hybridflow.inference.client import HttpClient
from hybridflow.utils.async_run import run_coroutine
from hybridflow.weight_sync.base import WEIGHT_SYNCS, NamedTensorPairs, SyncReport, WeightSync


@WEIGHT_SYNCS.register("http")
class HttpSync(WeightSync):
    """The target is an :class:`~hybridflow.inference.client.HttpClient` (or a URL to make one
    from, with ``api_key`` / ``timeout_s``). Buckets go one request each
    (``POST /update_weights``); the server stages them and swaps after the last, once its
    running requests are done. A refused bucket raises here and the server keeps its weights."""

    name = "http"

    def __init__(
        self, target: HttpClient | str, bucket_bytes: int, api_key: str | None = None, timeout_s: float = 600.0
    ) -> None:
        if isinstance(target, str):
            target = HttpClient(target, api_key=api_key, timeout_s=timeout_s, weight_bucket_bytes=bucket_bytes)
        target.weight_bucket_bytes = bucket_bytes
        super().__init__(target, bucket_bytes)

    def _deliver(self, named_tensors: NamedTensorPairs, version: int, report: SyncReport) -> None:
        client: HttpClient = self.target
        before = client.buckets_sent
        run_coroutine(client.update_weights(named_tensors, version))
        report.buckets = client.buckets_sent - before

    def close(self) -> None:
        self.target.close()


class HttpFolderTarget:
    """A ``hybridflow serve`` process as the target of the ``disk`` backend: the server loads
    the folder itself (``POST /update_weights_from_disk``), so the folder must lie inside the
    server's ``--weights-root``."""

    def __init__(self, client: HttpClient) -> None:
        self.client = client

    def load_folder(self, folder: str, version: int) -> int:
        return run_coroutine(self.client.update_weights_from_disk(str(folder), version))
