"""Read and write row files (parquet or JSON lines) as lists of plain dicts.

Both formats hold the same rows: nested lists and dicts survive a round trip (parquet stores
them as list / struct columns). Writes go to a temporary file renamed into place, so an
interrupted write never leaves a truncated file under the final name.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from hybridflow.utils.errors import InputError

SUPPORTED_SUFFIXES: tuple[str, ...] = (".parquet", ".jsonl")


class DataFileError(InputError, ValueError):
    """A data file is missing, of an unknown kind, or not parseable."""


def file_format(path: str | os.PathLike) -> str:
    """``"parquet"`` or ``"jsonl"`` from the file name; anything else is an error."""
    suffix = Path(path).suffix.lower()
    if suffix not in SUPPORTED_SUFFIXES:
        raise DataFileError(
            f"{path}: unsupported data file type {suffix or '(none)'!r}; supported: {', '.join(SUPPORTED_SUFFIXES)}"
        )
    return suffix[1:]


def read_rows(path: str | os.PathLike) -> list[dict[str, Any]]:
    """All rows of a parquet or JSON-lines file, in file order.

    Blank lines in a JSON-lines file are skipped; a line that is not a JSON object raises
    :class:`DataFileError` naming the file and the 0-based row index.
    """
    kind = file_format(path)
    if not Path(path).is_file():
        raise DataFileError(f"{path}: data file not found")
    if kind == "parquet":
        try:
            return pq.read_table(path).to_pylist()
        except (pa.ArrowException, OSError) as exc:
            raise DataFileError(f"{path}: not a readable parquet file: {exc}") from exc
    return _read_jsonl(Path(path))


def read_column(path: str | os.PathLike, column: str) -> list[Any]:
    """One column of a row file (None where a row lacks it); parquet reads only that column."""
    if file_format(path) == "parquet" and Path(path).is_file():
        try:
            if column not in pq.read_schema(path).names:
                return []
            return pq.read_table(path, columns=[column]).column(column).to_pylist()
        except (pa.ArrowException, OSError) as exc:
            raise DataFileError(f"{path}: not a readable parquet file: {exc}") from exc
    return [row.get(column) for row in read_rows(path)]


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    with path.open("rb") as fh:
        for line_no, raw in enumerate(fh, start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise DataFileError(
                    f"{path}: row {len(rows)} (line {line_no}): not UTF-8 text (byte 0x{raw[exc.start]:02x} at "
                    f"column {exc.start + 1}); JSON-lines files must be UTF-8"
                ) from exc
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise DataFileError(f"{path}: row {len(rows)} (line {line_no}): invalid JSON: {exc}") from exc
            if not isinstance(row, dict):
                raise DataFileError(
                    f"{path}: row {len(rows)} (line {line_no}): expected a JSON object, got {type(row).__name__}"
                )
            rows.append(row)
    return rows


def write_rows(rows: Sequence[dict[str, Any]], path: str | os.PathLike) -> Path:
    """Write ``rows`` to ``path`` (format from the suffix); returns the path.

    Every row must have the same top-level keys (parquet needs one schema); the parent
    folder is created if missing.
    """
    path = Path(path)
    kind = file_format(path)
    if not rows:
        raise DataFileError(f"{path}: refusing to write an empty file (no rows)")
    keys = list(rows[0])
    for i, row in enumerate(rows):
        if list(row) != keys:
            raise DataFileError(f"{path}: row {i} has keys {sorted(row)}, row 0 has {sorted(keys)}")
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        if kind == "parquet":
            pq.write_table(pa.Table.from_pylist(list(rows)), tmp_name)
        else:
            with open(tmp_name, "w", encoding="utf-8") as fh:
                for row in rows:
                    fh.write(json.dumps(row, ensure_ascii=False) + "\n")
        os.replace(tmp_name, path)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise
    return path
