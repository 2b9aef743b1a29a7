"""What every HTTP request passes before a route sees it: Host header, API key, body size.

* **Host header.** A web page can make a browser send requests to ``127.0.0.1`` under its own
  domain name by re-pointing that name's DNS record (DNS rebinding); the browser then treats
  the local server as part of the page's origin. Such requests carry the page's domain in
  ``Host``, so the server answers only the names it was bound to (:func:`default_allowed_hosts`)
  unless ``--allowed-hosts`` says otherwise.
* **API key.** With ``--api-key`` (or ``HYBRIDFLOW_API_KEY``) every request must carry
  ``Authorization: Bearer KEY``, as the ``openai`` client sends its ``api_key``.
* **Body size.** A body above ``max_body_bytes`` is refused before it is parsed: by its
  ``Content-Length`` at once, or (chunked) as soon as the bytes received pass the limit.

Refusals use OpenAI's error body; 400 for a foreign host, 401 for a key, 413 for a body.
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import socket
from collections.abc import Awaitable, Callable, Iterable, Mapping, MutableMapping
from typing import Any

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

ANY_HOST = "*"
ANY_IP = "<any ip literal>"  # in an allow-list: every IP address (not a name a host could have)
_LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")


class BodyTooLarge(Exception):
    """Raised into the route while it reads a chunked body that passes the limit."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"request body is larger than this server's limit of {limit} bytes")
        self.limit = limit


def _ip(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None


def normalize_host(host: str) -> str:
    """A host name or IP literal as compared: lower case, no trailing dot, no IPv6 brackets,
    IP literals in their canonical form (``0:0::1`` → ``::1``)."""
    host = host.strip().lower().rstrip(".")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    ip = _ip(host)
    return str(ip) if ip is not None else host


def split_host_header(value: str) -> str:
    """The host part of a ``Host`` header (``name``, ``name:port``, ``[v6]:port``)."""
    value = value.strip()
    if value.startswith("["):
        end = value.find("]")
        return normalize_host(value[: end + 1] if end > 0 else value)
    if value.count(":") == 1:
        value = value.split(":", 1)[0]
    return normalize_host(value)


def default_allowed_hosts(bind_host: str) -> frozenset[str]:
    """The names a server bound to ``bind_host`` answers to.

    A loopback address or ``localhost``: the loopback names. Another address or name: itself.
    A wildcard (``0.0.0.0``, ``::``): the machine's own names and (:data:`ANY_IP`) any IP
    literal — an IP in ``Host`` names no domain, so it cannot come from a rebound name.
    """
    host = normalize_host(bind_host)
    ip = _ip(host)
    if host == "localhost" or (ip is not None and ip.is_loopback):
        return frozenset({*_LOOPBACK_NAMES, host})
    if ip is not None and ip.is_unspecified:
        names = {socket.gethostname(), socket.getfqdn()}
        return frozenset({ANY_IP, *_LOOPBACK_NAMES, *(normalize_host(n) for n in names if n)})
    return frozenset({host})


def parse_allowed_hosts(value: str | None, bind_host: str) -> frozenset[str]:
    """``--allowed-hosts`` (comma-separated; ``*`` = any) or the default for ``bind_host``."""
    if value is None:
        return default_allowed_hosts(bind_host)
    names = [normalize_host(part) for part in value.split(",") if part.strip()]
    if not names:
        raise ValueError("--allowed-hosts is empty; give host names, or * to accept any")
    return frozenset(names)


def host_allowed(host: str, allowed: Iterable[str]) -> bool:
    allowed = frozenset(allowed)
    if ANY_HOST in allowed or host in allowed:
        return True
    return ANY_IP in allowed and _ip(host) is not None


async def _reply(send: Send, status: int, message: str, code: str, headers: list[tuple[bytes, bytes]] = ()) -> None:
    body = json.dumps(
        {"error": {"message": message, "type": "invalid_request_error", "param": None, "code": code}}
    ).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            *headers]})
    await send({"type": "http.response.body", "body": body})


class RequestGuard:
    """ASGI middleware: Host allow-list, optional bearer key, body size limit (see the module doc)."""

    def __init__(
        self,
        app: ASGIApp,
        allowed_hosts: Iterable[str],
        api_key: str | None,
        max_body_bytes: int,
        body_limits: Mapping[str, int] | None = None,
    ) -> None:
        self.app = app
        self.allowed_hosts = frozenset(allowed_hosts)
        self.api_key = api_key.encode() if api_key else None
        self.max_body_bytes = max_body_bytes
        self.body_limits = dict(body_limits or {})  # path → its own limit (weight pushes are large)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v for k, v in scope.get("headers", [])}
        host = split_host_header(headers.get("host", b"").decode("latin-1"))
        if not host_allowed(host, self.allowed_hosts):
            await _reply(send, 400, f"Host {host!r} is not served here (the server answers only the names it "
                         "listens on; see --allowed-hosts)", "invalid_host")
            return
        if self.api_key is not None and not self._key_ok(headers.get("authorization", b"")):
            await _reply(send, 401, "missing or wrong API key: send the header 'Authorization: Bearer KEY'",
                         "invalid_api_key", [(b"www-authenticate", b"Bearer")])
            return
        limit = self.body_limits.get(scope.get("path", ""), self.max_body_bytes)
        length = headers.get("content-length")
        if length is not None and (not length.isdigit() or int(length) > limit):
            await _reply(send, 413, f"request body is larger than this server's limit of {limit} "
                         "bytes", "body_too_large")
            return
        await self.app(scope, self._counting(receive, limit), send)

    def _key_ok(self, header: bytes) -> bool:
        scheme, _, token = header.partition(b" ")
        # compare_digest: the time taken does not tell how much of a guessed key was right.
        return scheme.lower() == b"bearer" and hmac.compare_digest(token.strip(), self.api_key)

    @staticmethod
    def _counting(receive: Receive, limit: int) -> Receive:
        seen = 0

        async def wrapped() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    raise BodyTooLarge(limit)
            return message

        return wrapped
