"""The request guard of ``hybridflow serve``: Host header, Origin, API key and control token,
Content-Type, body size.

The mechanism lives in :mod:`hybridflow.utils.http_guard` (``hybridflow sandbox`` uses the same
one); this module names it for the server. What the server adds is which routes need the
control token (:data:`CONTROL_PATHS`, see :mod:`hybridflow.server.control`) and where that
token comes from (``--control-token``, ``$HYBRIDFLOW_CONTROL_TOKEN``, ``--api-key``, or one
generated and printed at start; ``hybridflow/entrypoints/serve.py``).
"""

from __future__ import annotations

from hybridflow.utils.http_guard import (
    ANY_HOST,
    ANY_IP,
    JSON,
    BodyTooLarge,
    RequestGuard,
    RouteToken,
    default_allowed_hosts,
    host_allowed,
    is_loopback,
    new_token,
    normalize_host,
    origin_allowed,
    origin_host,
    parse_allowed_hosts,
    split_host_header,
)

__all__ = [
    "ANY_HOST",
    "ANY_IP",
    "JSON",
    "BodyTooLarge",
    "RequestGuard",
    "RouteToken",
    "default_allowed_hosts",
    "host_allowed",
    "is_loopback",
    "new_token",
    "normalize_host",
    "origin_allowed",
    "origin_host",
    "parse_allowed_hosts",
    "split_host_header",
]
