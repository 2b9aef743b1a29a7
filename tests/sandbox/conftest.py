"""Fixtures for the sandbox tests.

The guarantees that need namespaces (no network, no view of the host's files, every process
dying with the run) hold only under bubblewrap; those tests carry ``needs_bwrap`` (defined in
each test module from :func:`detect_isolation`). CI installs bubblewrap (``.ci/run``); a
machine without it skips them with the reason, visible in pytest's summary.
"""

from __future__ import annotations

import socket

import pytest


@pytest.fixture
def listener():
    """A TCP socket listening on 127.0.0.1: (port, socket); a sandboxed program must not reach it."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    server.settimeout(0.5)
    try:
        yield server.getsockname()[1], server
    finally:
        server.close()
