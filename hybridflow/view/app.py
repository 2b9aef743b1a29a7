"""The ``hybridflow view`` web app: one page and a small JSON API over the given run folders.

Routes never take a path: a run is its index on the command line, a dump folder its index in
that run, a step an integer, and :func:`~hybridflow.view.run_reader.confined` refuses any file
that resolves outside the run folders (and ``--dump`` folders) given. The page and its scripts
are a fixed set of files shipped in the package (the charts from plotly's Python package), so
the page loads nothing from the network. The project's request guard checks ``Host`` and
``Origin`` as for ``hybridflow serve``: another web site cannot read the runs through the
browser.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hybridflow.utils.http_guard import RequestGuard, default_allowed_hosts
from hybridflow.view.run_reader import Run, confined, distinct_names, follow_prompt, read_dump, read_metrics

PAGE_DIR = Path(__file__).parent / "page"
ASSETS: dict[str, str] = {
    "style.css": "text/css",
    "common.js": "text/javascript",
    "curves.js": "text/javascript",
    "rollouts.js": "text/javascript",
    "conversation.js": "text/javascript",
    "timing.js": "text/javascript",
    "app.js": "text/javascript",
}


def plotly_js() -> str:
    """plotly.js as shipped inside the plotly Python package (no CDN)."""
    from plotly.offline import get_plotlyjs  # type: ignore[import-untyped]  # plotly ships no type hints

    return str(get_plotlyjs())


def run_summary(index: int, run: Run) -> dict[str, Any]:
    """What the page needs to list a run: its name, folder, dumps and their steps."""
    dumps = [{"id": i, "name": d.name, "kind": d.kind, "steps": d.steps()} for i, d in enumerate(run.dumps)]
    return {"id": index, "name": run.name, "path": str(run.root), "dumps": dumps}


def metrics_payload(run: Run, since: float | None = None) -> dict[str, Any]:
    """The run's metric rows after step ``since`` (all when None) and the reader's notes."""
    rows, notes = read_metrics(
        confined(run.metrics_path, [run.root]) if run.metrics_path.exists() else run.metrics_path
    )
    if since is not None:
        rows = [r for r in rows if r["step"] is not None and r["step"] > since]
    return {"rows": rows, "notes": notes}


def dump_payload(run: Run, dump_id: int, step: int) -> dict[str, Any]:
    """One step of one dump folder: its rows and notes."""
    dump = run.dumps[dump_id]
    path = confined(dump.path / f"{step}.jsonl", [run.root, *run.extra_roots])
    rows, notes = read_dump(path)
    return {"step": step, "kind": dump.kind, "rows": rows, "notes": notes}


def create_app(runs: list[Run], bind_host: str = "127.0.0.1") -> Any:
    """The FastAPI app serving ``runs``: the page, its assets, the JSON API."""
    distinct_names(runs)
    from fastapi import FastAPI, Request
    from fastapi.responses import JSONResponse

    app = FastAPI(title="hybridflow view", docs_url=None, redoc_url=None, openapi_url=None)
    app.add_middleware(
        RequestGuard,
        allowed_hosts=default_allowed_hosts(bind_host),
        api_key=None,
        max_body_bytes=1024,
        route_token=None,
    )

    @app.exception_handler(PermissionError)
    async def outside(_: Request, exc: PermissionError) -> JSONResponse:  # confined() refused a file
        return JSONResponse({"detail": str(exc)}, status_code=403)

    _page_routes(app)
    _api_routes(app, runs)
    return app


def _page_routes(app: Any) -> None:
    """``/`` and the fixed set of ``/assets/*`` (no name reaches the file system unchecked)."""
    from fastapi import HTTPException
    from fastapi.responses import HTMLResponse, Response

    cache: dict[str, str] = {}

    @app.get("/", response_class=HTMLResponse)
    def index() -> str:
        return (PAGE_DIR / "index.html").read_text(encoding="utf-8").replace("/*EXPORTED_DATA*/", "")

    @app.get("/assets/{name}")
    def asset(name: str) -> Response:
        if name == "plotly.min.js":
            cache.setdefault(name, plotly_js())
            return Response(cache[name], media_type="text/javascript")
        if name not in ASSETS:
            raise HTTPException(404, "no such asset")
        return Response((PAGE_DIR / name).read_text(encoding="utf-8"), media_type=ASSETS[name])


def _api_routes(app: Any, runs: list[Run]) -> None:
    """``/api/...``: runs, dump folders and steps are numbers, never paths."""
    from fastapi import HTTPException

    def run_at(run_id: int, dump_id: int | None = None) -> Run:
        if not 0 <= run_id < len(runs):
            raise HTTPException(404, f"no run {run_id}")
        if dump_id is not None and not 0 <= dump_id < len(runs[run_id].dumps):
            raise HTTPException(404, f"run {run_id} has no dump folder {dump_id}")
        return runs[run_id]

    @app.get("/api/runs")
    def list_runs() -> list[dict[str, Any]]:
        return [run_summary(i, run) for i, run in enumerate(runs)]

    @app.get("/api/runs/{run_id}/metrics")
    def metrics(run_id: int, since: float | None = None) -> dict[str, Any]:
        return metrics_payload(run_at(run_id), since)

    @app.get("/api/runs/{run_id}/dumps/{dump_id}/follow")
    def follow(run_id: int, dump_id: int, prompt: str) -> list[dict[str, Any]]:
        run = run_at(run_id, dump_id)
        return follow_prompt(run.dumps[dump_id], prompt, [run.root, *run.extra_roots])

    @app.get("/api/runs/{run_id}/dumps/{dump_id}/{step}")
    def dump_step(run_id: int, dump_id: int, step: int) -> dict[str, Any]:
        return dump_payload(run_at(run_id, dump_id), dump_id, step)
