"""``hybridflow view RUN_DIR --export report.html``: the page as one self-contained file.

The page, its scripts, plotly.js and the runs' data are written into one HTML file that opens
without a server or a network (its Content-Security-Policy allows no fetch at all). A report
must stay small enough to send: each dump folder keeps its last ``max_steps`` steps and each
step its first ``max_rows`` rows, and the report's notes say what was left out.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from hybridflow.view.app import ASSETS, PAGE_DIR, dump_payload, metrics_payload, plotly_js, run_summary
from hybridflow.view.run_reader import Run, distinct_names

OFFLINE_CSP = (
    "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src data: blob:; font-src data:"
)


def _inline_script(code: str) -> str:
    """Code for a ``<script>`` element: a ``</script`` inside would end it early."""
    return code.replace("</script", "<\\/script").replace("<!--", "<\\!--")


def export_data(runs: list[Run], max_steps: int, max_rows: int) -> dict[str, Any]:
    """Every API answer the page asks for, keyed by its path, bounded by ``max_steps``/``max_rows``."""
    distinct_names(runs)
    api: dict[str, Any] = {}
    summaries = []
    for index, run in enumerate(runs):
        summary = run_summary(index, run)
        api[f"/api/runs/{index}/metrics"] = metrics_payload(run)
        for dump in summary["dumps"]:
            kept = dump["steps"][-max_steps:]
            for step in kept:
                payload = dump_payload(run, dump["id"], step)
                if len(payload["rows"]) > max_rows:
                    payload["notes"].append(f"the report keeps the first {max_rows} of {len(payload['rows'])} rows")
                    payload["rows"] = payload["rows"][:max_rows]
                api[f"/api/runs/{index}/dumps/{dump['id']}/{step}"] = payload
            if len(kept) < len(dump["steps"]):
                api[f"/api/runs/{index}/metrics"]["notes"].append(
                    f"{dump['name']}: the report keeps the last {max_steps} of {len(dump['steps'])} steps"
                )
            dump["steps"] = kept
        summaries.append(summary)
    api["/api/runs"] = summaries
    return {"api": api, "created": time.strftime("%Y-%m-%d %H:%M")}


def render_report(runs: list[Run], max_steps: int = 20, max_rows: int = 256) -> str:
    """The self-contained HTML text."""
    page = (PAGE_DIR / "index.html").read_text(encoding="utf-8")
    data = json.dumps(export_data(runs, max_steps, max_rows), ensure_ascii=False, allow_nan=False)
    page = page.replace("/*EXPORTED_DATA*/", _inline_script(f"window.HF_EXPORT = {data};"))
    page = page.replace(
        '<script src="/assets/plotly.min.js"></script>', f"<script>{_inline_script(plotly_js())}</script>"
    )
    for name, media in ASSETS.items():
        text = (PAGE_DIR / name).read_text(encoding="utf-8")
        if media == "text/css":
            page = page.replace(f'<link rel="stylesheet" href="/assets/{name}">', f"<style>{text}</style>")
        else:
            page = page.replace(f'<script src="/assets/{name}"></script>', f"<script>{_inline_script(text)}</script>")
    start = page.index('content="', page.index("Content-Security-Policy")) + len('content="')
    return page[:start] + OFFLINE_CSP + page[page.index('"', start) :]


def export_report(runs: list[Run], out: str | Path) -> Path:
    """Write the report to ``out`` and return its path."""
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render_report(runs), encoding="utf-8")
    return path
