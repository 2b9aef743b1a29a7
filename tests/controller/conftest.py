"""One local Ray instance (2 CPUs, no dashboard) for the whole test session, started on first use."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO_ROOT = str(Path(__file__).resolve().parents[2])


@pytest.fixture(scope="session")
def ray_session() -> Iterator[None]:
    import ray

    if ray.is_initialized():  # another area's fixture started it: share, do not stop it
        yield
        return
    # Ray's worker processes inherit this environment: make the repository (hybridflow and
    # tests.controller.toy_workers) importable there whatever directory pytest ran from.
    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = REPO_ROOT if not old else REPO_ROOT + os.pathsep + old
    try:
        ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    finally:
        if old is None:
            del os.environ["PYTHONPATH"]
        else:
            os.environ["PYTHONPATH"] = old
    yield
    ray.shutdown()
