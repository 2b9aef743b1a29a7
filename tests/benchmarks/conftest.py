"""Benchmarks start the CLI through the running interpreter (``benchmarks/common.py``'s
``HYBRIDFLOW``), never by the ``hybridflow`` command's name: a user who runs them with a
virtualenv's python without activating it has no such command on PATH. Every smoke test here
runs with the folders that hold a ``hybridflow`` command taken off PATH, so a benchmark that
calls it by name fails here, not on that user's machine."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


@pytest.fixture(autouse=True)
def _no_hybridflow_command_on_path(monkeypatch: pytest.MonkeyPatch) -> None:
    folders = os.environ.get("PATH", "").split(os.pathsep)
    kept = [f for f in folders if f and not (Path(f) / "hybridflow").exists()]
    monkeypatch.setenv("PATH", os.pathsep.join(kept))
