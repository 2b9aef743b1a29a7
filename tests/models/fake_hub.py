"""A fake Hugging Face Hub on 127.0.0.1, for testing downloads without the network.

It answers the four requests that ``huggingface_hub.snapshot_download`` (2.x) makes, as the real
Hub does:

* ``GET /api/models/{org}/{name}/revision/{rev}`` — the repo's info at ``rev``: ``id``, ``sha``
  (the commit) and ``siblings``;
* ``GET /api/models/{org}/{name}/tree/{commit}?recursive=...`` — the file list (``type``,
  ``path``, ``size``, ``oid``), one page (no ``Link`` header);
* ``HEAD`` / ``GET /{org}/{name}/resolve/{rev}/{filename}`` — the file, with ``X-Repo-Commit``,
  a quoted ``ETag`` (its sha256: the blob name in the cache) and ``Content-Length``; a
  ``Range: bytes=N-`` request gets ``206`` and ``Content-Range``.

Errors carry the Hub's ``X-Error-Code`` header (``RepoNotFound``, ``RevisionNotFound``,
``EntryNotFound``, ``GatedRepo``), from which huggingface_hub picks its exception class.
Faults for tests: ``truncate_first_get`` (the first GET of those files sends half the bytes and
closes the connection) and ``refuse_resume`` (a Range request gets 503).
"""

from __future__ import annotations

import hashlib
import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import pytest
from huggingface_hub import constants


@dataclass
class FakeRepo:
    commits: dict[str, dict[str, bytes]] = field(default_factory=dict)  # commit sha -> path -> bytes
    refs: dict[str, str] = field(default_factory=dict)  # branch or tag -> commit sha
    gated: bool = False

    def commit_of(self, revision: str) -> str | None:
        return revision if revision in self.commits else self.refs.get(revision)


class FakeHub:
    """The repos it serves, the requests it saw, and the faults to inject."""

    def __init__(self) -> None:
        self.repos: dict[str, FakeRepo] = {}
        self.requests: list[tuple[str, str, str | None]] = []  # (method, path, Range header)
        self.truncate_first_get: set[str] = set()
        self.refuse_resume = False
        self._server: ThreadingHTTPServer | None = None
        self._lock = threading.Lock()

    def add_revision(self, repo_id: str, folder: Path, ref: str = "main", extra: dict[str, bytes] | None = None) -> str:
        """Serve ``folder``'s files (plus ``extra``) as a new commit of ``repo_id`` that ``ref``
        points to; returns the commit sha."""
        files = {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}
        files.update(extra or {})
        digest = hashlib.sha1(repo_id.encode())
        for name, data in sorted(files.items()):
            digest.update(name.encode() + hashlib.sha256(data).digest())
        commit = digest.hexdigest()
        repo = self.repos.setdefault(repo_id, FakeRepo())
        repo.commits[commit] = files
        repo.refs[ref] = commit
        return commit

    def start(self) -> str:
        handler = type("BoundHandler", (_Handler,), {"hub": self})
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        # a short poll so that stop() returns at once
        threading.Thread(target=self._server.serve_forever, args=(0.02,), daemon=True).start()
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def record(self, method: str, path: str, range_header: str | None) -> None:
        with self._lock:
            self.requests.append((method, path, range_header))

    def downloaded(self) -> list[str]:
        """Paths of the files fetched with GET (``resolve`` requests), in order."""
        return [
            path.split("/resolve/", 1)[1].split("/", 1)[1]
            for m, path, _ in self.requests
            if m == "GET" and "/resolve/" in path
        ]


class _Handler(BaseHTTPRequestHandler):
    hub: FakeHub

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (the base class's name)
        pass  # keep pytest's output clean

    def do_HEAD(self) -> None:  # noqa: N802 (http.server's naming)
        self._answer(head=True)

    def do_GET(self) -> None:  # noqa: N802
        self._answer(head=False)

    def _answer(self, head: bool) -> None:
        url = urlsplit(self.path)
        self.hub.record(self.command, url.path, self.headers.get("Range"))
        parts = [unquote(p) for p in url.path.split("/")[1:]]
        if parts[:2] == ["api", "models"] and len(parts) == 6 and parts[4] in ("revision", "tree"):
            self._api(f"{parts[2]}/{parts[3]}", parts[4], parts[5])
        elif len(parts) >= 5 and parts[2] == "resolve":
            self._file(f"{parts[0]}/{parts[1]}", parts[3], "/".join(parts[4:]), head)
        else:
            self._error(404, "EntryNotFound")

    def _lookup(self, repo_id: str, revision: str) -> tuple[dict[str, bytes], str] | None:
        repo = self.hub.repos.get(repo_id)
        if repo is None:
            self._error(404, "RepoNotFound")
            return None
        if repo.gated:
            self._error(401, "GatedRepo")
            return None
        commit = repo.commit_of(revision)
        if commit is None:
            self._error(404, "RevisionNotFound")
            return None
        return repo.commits[commit], commit

    def _api(self, repo_id: str, kind: str, revision: str) -> None:
        found = self._lookup(repo_id, revision)
        if found is None:
            return
        files, commit = found
        if kind == "revision":
            body: Any = {"id": repo_id, "sha": commit, "siblings": [{"rfilename": name} for name in files]}
        else:
            body = [
                {"type": "file", "path": name, "size": len(data), "oid": hashlib.sha1(data).hexdigest()}
                for name, data in files.items()
            ]
        self._send(200, json.dumps(body).encode(), {"Content-Type": "application/json"})

    def _file(self, repo_id: str, revision: str, filename: str, head: bool) -> None:
        found = self._lookup(repo_id, revision)
        if found is None:
            return
        files, commit = found
        if filename not in files:
            self._error(404, "EntryNotFound", {"X-Repo-Commit": commit})
            return
        data = files[filename]
        headers = {"X-Repo-Commit": commit, "ETag": f'"{hashlib.sha256(data).hexdigest()}"', "Accept-Ranges": "bytes"}
        start = _range_start(self.headers.get("Range"))
        if head:
            self._send_headers(200, {**headers, "Content-Length": str(len(data))})
        elif start:
            self._send_range(data, start, headers)
        elif filename in self.hub.truncate_first_get:
            self.hub.truncate_first_get.discard(filename)
            self._send_headers(200, {**headers, "Content-Length": str(len(data))})
            self.wfile.write(data[: len(data) // 2])  # then the connection closes: a cut transfer
            self.close_connection = True
        else:
            self._send(200, data, headers)

    def _send_range(self, data: bytes, start: int, headers: dict[str, str]) -> None:
        if self.hub.refuse_resume:
            self._error(503, "ServiceUnavailable")
            return
        headers = {**headers, "Content-Range": f"bytes {start}-{len(data) - 1}/{len(data)}"}
        self._send(206, data[start:], headers)

    def _error(self, status: int, code: str, headers: dict[str, str] | None = None) -> None:
        body = json.dumps({"error": code}).encode()
        self._send(status, body, {"X-Error-Code": code, "Content-Type": "application/json", **(headers or {})})

    def _send(self, status: int, body: bytes, headers: dict[str, str]) -> None:
        self._send_headers(status, {"Content-Length": str(len(body)), **headers})
        self.wfile.write(body)

    def _send_headers(self, status: int, headers: dict[str, str]) -> None:
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.end_headers()


def _range_start(header: str | None) -> int:
    """N of ``bytes=N-`` (the only form huggingface_hub sends when resuming), else 0."""
    if not header or not header.startswith("bytes="):
        return 0
    return int(header[len("bytes=") :].split("-", 1)[0] or 0)


def point_hub_client_at(monkeypatch: pytest.MonkeyPatch, endpoint: str, hf_home: Path) -> None:
    """Make huggingface_hub (already imported) talk to ``endpoint`` and cache under ``hf_home``,
    online, with no token. huggingface_hub reads HF_ENDPOINT / HF_HOME / HF_HUB_OFFLINE once at
    import, so its module constants are set as those variables would have set them."""
    monkeypatch.setenv("HF_HOME", str(hf_home))
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.delenv("HUGGING_FACE_HUB_TOKEN", raising=False)
    monkeypatch.setattr(constants, "ENDPOINT", endpoint)
    monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE", endpoint + "/{repo_id}/resolve/{revision}/{filename}")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(hf_home / "hub"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(hf_home / "token"))
    monkeypatch.setattr(constants, "HF_STORED_TOKENS_PATH", str(hf_home / "stored_tokens"))
