"""Reading run folders for ``hybridflow view``: metrics, rollout and validation dumps.

A run folder is what ``hybridflow train``, ``sft``, ``rm`` and the asynchronous trainers write
(``metrics.jsonl``, one JSON object per step) plus any folder of ``{step}.jsonl`` dumps inside it
(``trainer.rollout_data_dir`` / ``validation_data_dir`` pointed into the run folder, or given
with ``--dump``). Runs fail, so every reader here is tolerant: a line cut short, a line that is
not JSON, a NaN or a string where a number belongs, a file far larger than a page can show —
each is skipped or cut, and a *note* says what was left out, so the page can show it.

Nothing here takes a path from a request: files are named by the run, the dump folder's index
and an integer step, and :func:`confined` refuses anything that resolves outside the folders
given on the command line (a symlink pointing elsewhere included).
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

METRICS_FILE = "metrics.jsonl"
STEP_FILE = re.compile(r"^(\d+)\.jsonl$")
MAX_LINE_BYTES = 4 * 1024 * 1024  # one row longer than this is skipped, not read
MAX_ROWS = 2000  # rows of one dump step shown; the rest are counted in a note
MAX_TEXT = 20_000  # characters of one prompt/response shown
MAX_TOKENS = 4096  # per-token values of one row shown


@dataclass
class DumpDir:
    """A folder of ``{step}.jsonl`` files: training rollouts or validation generations."""

    name: str  # relative to the run folder, or the path given with --dump
    path: Path
    kind: str  # "rollouts" or "validation"

    def steps(self) -> list[int]:
        found = (STEP_FILE.match(p.name) for p in self.path.iterdir()) if self.path.is_dir() else iter(())
        return sorted(int(m.group(1)) for m in found if m)


@dataclass
class Run:
    """One run folder and the dump folders found in (or given for) it."""

    name: str
    root: Path
    dumps: list[DumpDir] = field(default_factory=list)
    extra_roots: list[Path] = field(default_factory=list)  # --dump folders outside root

    @property
    def metrics_path(self) -> Path:
        return self.root / METRICS_FILE


def confined(path: Path, roots: list[Path]) -> Path:
    """``path`` resolved, if it lies inside one of ``roots``; PermissionError otherwise."""
    real = path.resolve()
    if not any(real.is_relative_to(root.resolve()) for root in roots):
        raise PermissionError(f"{path} is outside the run folders given to hybridflow view")
    return real


def _dump_kind(folder: Path) -> str:
    return "validation" if "val" in folder.name.lower() else "rollouts"


def find_dumps(root: Path, max_depth: int = 2) -> list[DumpDir]:
    """Folders under ``root`` (to ``max_depth``) holding ``{step}.jsonl`` files; checkpoint
    folders (``global_step_N``) are not searched."""
    found: list[DumpDir] = []
    frontier = [root]
    for _ in range(max_depth):
        nxt = []
        for folder in frontier:
            for child in sorted(p for p in folder.iterdir() if p.is_dir() and not p.name.startswith("global_step_")):
                if any(STEP_FILE.match(p.name) for p in child.iterdir()):
                    found.append(DumpDir(str(child.relative_to(root)), child, _dump_kind(child)))
                nxt.append(child)
        frontier = nxt
    return found


def open_run(path: str | os.PathLike, extra_dumps: list[str] | None = None) -> Run:
    """A run folder with its dumps; ValueError naming the problem when it is no run folder."""
    root = Path(path)
    if not root.is_dir():
        raise ValueError(f"{root}: not a folder (give the run folder that holds {METRICS_FILE})")
    run = Run(name=root.resolve().name, root=root, dumps=find_dumps(root))
    for extra in extra_dumps or []:
        folder = Path(extra)
        if not folder.is_dir():
            raise ValueError(f"--dump {folder}: not a folder")
        run.dumps.append(DumpDir(str(folder), folder, _dump_kind(folder)))
        run.extra_roots.append(folder)
    if not run.metrics_path.is_file() and not run.dumps:
        raise ValueError(f"{root}: no {METRICS_FILE} and no folder of {{step}}.jsonl dumps in it")
    return run


def distinct_names(runs: list[Run]) -> None:
    """Runs with the same folder name (``default`` of two projects) are told apart in the legend
    by as many parent folders as it takes."""
    for depth in range(1, 6):
        names = [r.name for r in runs]
        clashing = {n for n in names if names.count(n) > 1}
        if not clashing:
            return
        for run in runs:
            if run.name in clashing:
                run.name = "/".join(run.root.resolve().parts[-depth - 1 :])


def _read_lines(path: Path, notes: list[str]) -> Any:
    """``(line number, parsed object)`` for each good line; bad ones become notes. A last line
    without its newline is a write in progress (or a crash): skipped and noted."""
    with path.open("rb") as f:
        for number, raw in enumerate(iter(lambda: f.readline(MAX_LINE_BYTES + 1), b""), start=1):
            if len(raw) > MAX_LINE_BYTES and not raw.endswith(b"\n"):
                notes.append(f"{path.name} line {number}: longer than {MAX_LINE_BYTES} bytes, skipped")
                while raw and not raw.endswith(b"\n"):
                    raw = f.readline(MAX_LINE_BYTES + 1)
                continue
            if not raw.strip():
                continue
            if not raw.endswith(b"\n"):
                notes.append(f"{path.name} line {number}: cut short (no newline yet), skipped")
                continue
            try:
                yield number, json.loads(raw)
            except ValueError:
                notes.append(f"{path.name} line {number}: not JSON, skipped")


def _number(value: Any) -> float | None:
    """A finite float, or None for NaN, infinities, null and anything not a number."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def read_metrics(path: Path) -> tuple[list[dict[str, float | None]], list[str]]:
    """Rows ``{"step": N, key: value}`` with only finite numbers (None where the run logged
    NaN or null: a gap on the chart) and notes on what was skipped."""
    notes: list[str] = []
    if not path.is_file():
        return [], [f"{path.name}: missing (the run logged no metrics, or trainer.logger lacked jsonl)"]
    rows: list[dict[str, float | None]] = []
    gaps: dict[str, int] = {}
    for number, obj in _read_lines(path, notes):
        step = obj.get("step") if isinstance(obj, dict) else None
        if _number(step) is None:
            notes.append(f"{path.name} line {number}: no numeric 'step', skipped")
            continue
        row: dict[str, float | None] = {"step": step}
        for key, value in obj.items():
            if key == "step":
                continue
            row[key] = _number(value)
            if row[key] is None:
                gaps[key] = gaps.get(key, 0) + 1
        rows.append(row)
    notes += [f"{key}: {n} NaN/null/non-numeric value(s), shown as gaps" for key, n in sorted(gaps.items())]
    return rows, notes


def _clean(value: Any) -> Any:
    """JSON-safe: NaN and infinities become None, nested lists and dicts cleaned too."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, list):
        return [_clean(v) for v in value[:MAX_TOKENS]]
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    return value


def normalize_row(obj: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    """One dump row with ``prompt``/``response`` whichever writer made it (hybridflow's
    ``prompt``/``response`` or verl's ``input``/``output``); True when something was cut."""
    row = {k: _clean(v) for k, v in obj.items()}
    row.setdefault("prompt", row.pop("input", ""))
    row.setdefault("response", row.pop("output", ""))
    cut = False
    for key in ("prompt", "response"):
        text = str(row.get(key) or "")
        if len(text) > MAX_TEXT:
            text, cut = text[:MAX_TEXT] + " …[cut]", True
        row[key] = text
    cut = cut or any(isinstance(v, list) and len(v) > MAX_TOKENS for v in obj.values())
    return row, cut


def read_dump(path: Path, max_rows: int = MAX_ROWS) -> tuple[list[dict[str, Any]], list[str]]:
    """The rows of one ``{step}.jsonl`` dump (at most ``max_rows``) and notes."""
    notes: list[str] = []
    if not path.is_file():
        return [], [f"{path.name}: missing"]
    rows: list[dict[str, Any]] = []
    cut = extra = 0
    for number, obj in _read_lines(path, notes):
        if not isinstance(obj, dict):
            notes.append(f"{path.name} line {number}: not a JSON object, skipped")
        elif len(rows) >= max_rows:
            extra += 1
        else:
            row, was_cut = normalize_row(obj)
            row["_line"] = number
            rows.append(row)
            cut += was_cut
    if extra:
        notes.append(f"{path.name}: {len(rows) + extra} rows, showing the first {max_rows}")
    if cut:
        notes.append(f"{path.name}: {cut} row(s) with text or token lists cut to fit the page")
    return rows, notes


def follow_prompt(dump: DumpDir, prompt: str, roots: list[Path], max_steps: int = 200) -> list[dict[str, Any]]:
    """The same prompt across the dump's steps: per step, its rows' scores and responses."""
    out = []
    for step in dump.steps()[-max_steps:]:
        rows, _ = read_dump(confined(dump.path / f"{step}.jsonl", roots))
        mine = [r for r in rows if r["prompt"] == prompt]
        if mine:
            scores = [s for s in (_number(r.get("score")) for r in mine) if s is not None]
            out.append(
                {
                    "step": step,
                    "n": len(mine),
                    "mean_score": sum(scores) / len(scores) if scores else None,
                    "rows": [{"response": r["response"], "score": r.get("score")} for r in mine[:8]],
                }
            )
    return out
