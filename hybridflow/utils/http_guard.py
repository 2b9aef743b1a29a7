"""What every HTTP request to a hybridflow service passes before a route sees it.

One ASGI middleware, :class:`RequestGuard`, shared by ``hybridflow serve`` (``server/``) and
``hybridflow sandbox`` (``sandbox/service.py``). In order:

* **Host header.** A web page can make a browser send requests to ``127.0.0.1`` under its own
  domain name by re-pointing that name's DNS record (DNS rebinding); the browser then treats
  the local server as part of the page's origin. Such requests carry the page's domain in
  ``Host``, so a service answers only the names it was bound to (:func:`default_allowed_hosts`)
  unless told otherwise (``--allowed-hosts``). Refused with 400 ``invalid_host``.
* **Origin header.** A browser names the page that made a request in ``Origin`` (cross-site
  requests always carry it). A request with an ``Origin`` whose host is neither the request's
  own host nor one of the allowed names (``null`` included) is refused with 403
  ``invalid_origin``. Requests without ``Origin`` (curl, the ``openai`` client, our own
  clients) pass: only a browser adds it.
* **Keys.** With ``api_key`` every request needs ``Authorization: Bearer KEY``; a
  :class:`RouteToken` adds a bearer token that only some routes need (``serve``'s control
  routes, the sandbox's ``/run_code``). Refused with 401.
* **Content-Type.** A request with a body (any method but GET, HEAD, OPTIONS) must declare the
  media type its route reads: ``application/json`` unless ``body_types`` names another. A web
  page can send ``text/plain``, form types, or no type at all to any address without the
  browser asking the server first (a CORS "simple request"), and a JSON reader that ignores
  the declared type would run it; ``application/json`` makes the browser ask first (a
  preflight), which these services never answer. Refused with 415 ``unsupported_media_type``.
* **Body size.** A body above its limit is refused before it is parsed: by its
  ``Content-Length`` at once (413 ``body_too_large``), or (chunked) as soon as the bytes
  received pass the limit (:class:`BodyTooLarge` is raised into the route, whose app answers 413).

Refusals use OpenAI's error body ``{"error": {"message", "type", "param", "code"}}``.
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import secrets
import socket
from collections.abc import Awaitable, Callable, Iterable, Mapping, MutableMapping
from dataclasses import dataclass
from typing import Any, NamedTuple
from urllib.parse import urlsplit

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

ANY_HOST = "*"
ANY_IP = "<any ip literal>"  # in an allow-list: every IP address (not a name a host could have)
JSON = "application/json"
_LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")
_BODYLESS_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


class BodyTooLarge(Exception):
    """Raised into the route while it reads a chunked body that passes the limit."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"request body is larger than this server's limit of {limit} bytes")
        self.limit = limit


@dataclass(frozen=True)
class RouteToken:
    """A bearer token that the routes in ``paths`` need (on top of any API key); ``hint`` ends
    the 401's message and says where the token comes from."""

    token: str
    paths: frozenset[str]
    hint: str

    def __post_init__(self) -> None:
        if not self.token:
            raise ValueError("a route token must not be empty")


def new_token() -> str:
    """A fresh random bearer token (256 bits, URL-safe text)."""
    return secrets.token_urlsafe(32)


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


def is_loopback(bind_host: str) -> bool:
    """``bind_host`` (a ``--host`` value) is reachable from this machine only."""
    host = normalize_host(bind_host)
    ip = _ip(host)
    return host == "localhost" or (ip is not None and ip.is_loopback)


def split_host_header(value: str) -> str:
    """The host part of a ``Host`` header (``name``, ``name:port``, ``[v6]:port``)."""
    value = value.strip()
    if value.startswith("["):
        end = value.find("]")
        return normalize_host(value[: end + 1] if end > 0 else value)
    if value.count(":") == 1:
        value = value.split(":", 1)[0]
    return normalize_host(value)


def origin_host(origin: str) -> str | None:
    """The host of an ``Origin`` header (``scheme://host[:port]``); ``None`` for ``null`` or a
    value that names no host."""
    try:
        parts = urlsplit(origin.strip())
        host = parts.hostname
    except ValueError:
        return None
    if not parts.scheme or not host:
        return None
    return normalize_host(host)


def default_allowed_hosts(bind_host: str) -> frozenset[str]:
    """The names a server bound to ``bind_host`` answers to.

    A loopback address or ``localhost``: the loopback names. Another address or name: itself.
    A wildcard (``0.0.0.0``, ``::``): the machine's own names and (:data:`ANY_IP`) any IP
    literal — an IP in ``Host`` names no domain, so it cannot come from a rebound name.
    """
    host = normalize_host(bind_host)
    ip = _ip(host)
    if is_loopback(host):
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


def origin_allowed(origin: str, request_host: str, allowed: Iterable[str]) -> bool:
    """A page at ``origin`` may call this service: it is served under the request's own host
    (same origin), or under one of the names ``allowed`` lists explicitly. The wildcards
    (``*``, any IP) do not extend to origins: a page on some other IP address is another site."""
    host = origin_host(origin)
    if host is None:
        return False
    return host == request_host or host in frozenset(allowed) - {ANY_HOST, ANY_IP}


def media_type(content_type: str) -> str:
    """``application/json; charset=utf-8`` → ``application/json``."""
    return content_type.split(";", 1)[0].strip().lower()


def refusal_body(message: str, code: str) -> dict[str, Any]:
    """The body of a refusal (OpenAI's error format), also for a chunked body cut off in a route."""
    return {"error": {"message": message, "type": "invalid_request_error", "param": None, "code": code}}


async def _reply(send: Send, status: int, message: str, code: str, headers: Iterable[tuple[bytes, bytes]] = ()) -> None:
    body = json.dumps(refusal_body(message, code)).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", JSON.encode()), (b"content-length", str(len(body)).encode()), *headers],
        }
    )
    await send({"type": "http.response.body", "body": body})


class _Refusal(NamedTuple):
    """A request turned away before the app sees it: :func:`_reply`'s arguments after ``send``."""

    status: int
    message: str
    code: str
    headers: tuple[tuple[bytes, bytes], ...] = ()


_BEARER_CHALLENGE: tuple[tuple[bytes, bytes], ...] = ((b"www-authenticate", b"Bearer"),)


class RequestGuard:
    """ASGI middleware: Host allow-list, Origin, bearer key and route token, Content-Type, body
    size (see the module doc).

    ``body_limits`` / ``body_types`` map a path to its own body limit / media type (a weight
    push is large and binary); every other path gets ``max_body_bytes`` and ``application/json``.
    """

    def __init__(
        self,
        app: ASGIApp,
        allowed_hosts: Iterable[str],
        api_key: str | None,
        max_body_bytes: int,
        body_limits: Mapping[str, int] | None = None,
        body_types: Mapping[str, str] | None = None,
        route_token: RouteToken | None = None,
    ) -> None:
        if max_body_bytes < 1:
            raise ValueError(f"max_body_bytes must be >= 1, got {max_body_bytes}")
        self.app = app
        self.allowed_hosts = frozenset(allowed_hosts)
        self.api_key = api_key.encode() if api_key else None
        self.max_body_bytes = max_body_bytes
        self.body_limits = dict(body_limits or {})
        self.body_types = {path: media_type(kind) for path, kind in (body_types or {}).items()}
        self.route_token = route_token

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        path = scope.get("path", "")
        refusal = self._access_refusal(headers, path) or self._body_refusal(scope, headers, path)
        if refusal is not None:
            await _reply(send, *refusal)
            return
        await self.app(scope, self._counting(receive, self.body_limits.get(path, self.max_body_bytes)), send)

    def _access_refusal(self, headers: Mapping[str, str], path: str) -> _Refusal | None:
        """Who may ask: the Host, the page's Origin, the API key, the route's token (in that order)."""
        host = split_host_header(headers.get("host", ""))
        if not host_allowed(host, self.allowed_hosts):
            return _Refusal(
                400,
                f"Host {host!r} is not served here (the server answers only the names it "
                "listens on; see --allowed-hosts)",
                "invalid_host",
            )
        origin = headers.get("origin")
        if origin is not None and not origin_allowed(origin, host, self.allowed_hosts):
            return _Refusal(
                403,
                f"requests from the web page at Origin {origin!r} are refused: only pages "
                "served under this server's own host names may call it (see --allowed-hosts)",
                "invalid_origin",
            )
        authorization = headers.get("authorization", "").encode("latin-1")
        if self.api_key is not None and not _bearer_ok(authorization, self.api_key):
            return _Refusal(
                401,
                "missing or wrong API key: send the header 'Authorization: Bearer KEY'",
                "invalid_api_key",
                _BEARER_CHALLENGE,
            )
        token = self.route_token
        if token is not None and path in token.paths and not _bearer_ok(authorization, token.token.encode()):
            return _Refusal(
                401,
                f"{path} needs a token: send the header 'Authorization: Bearer TOKEN' ({token.hint})",
                "invalid_token",
                _BEARER_CHALLENGE,
            )
        return None

    def _body_refusal(self, scope: Scope, headers: Mapping[str, str], path: str) -> _Refusal | None:
        """What may be sent: the body's declared Content-Type and length, before any byte is read."""
        if scope.get("method", "GET").upper() not in _BODYLESS_METHODS:
            expected = self.body_types.get(path, JSON)
            declared = media_type(headers.get("content-type", ""))
            if declared != expected:
                return _Refusal(
                    415,
                    f"{path} takes a body of Content-Type {expected}, got "
                    f"{declared or 'none'}: other types can be sent by any web page without the "
                    "browser asking this server first, so they are refused",
                    "unsupported_media_type",
                )
        limit = self.body_limits.get(path, self.max_body_bytes)
        length = headers.get("content-length")
        if length is not None and (not length.isdigit() or int(length) > limit):
            return _Refusal(413, f"request body is larger than this server's limit of {limit} bytes", "body_too_large")
        return None

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


def _bearer_ok(header: bytes, expected: bytes) -> bool:
    scheme, _, token = header.partition(b" ")
    # compare_digest: the time taken does not tell how much of a guessed key was right.
    return scheme.lower() == b"bearer" and hmac.compare_digest(token.strip(), expected)
