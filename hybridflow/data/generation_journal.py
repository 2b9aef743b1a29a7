"""Crash-safe progress of a batch-generation run: one part file per finished batch.

Layout, next to the final output ``OUT`` (e.g. ``gen.parquet``)::

    OUT.parts/manifest.json       {"fingerprint": ..., "num_rows": R, "batch_size": B}
    OUT.parts/batch-000000.jsonl  {"row": 0, "responses": [...]} for each row of batch 0
    OUT.parts/batch-000001.jsonl  ...

Every part is written to a temporary name and renamed into place (``write_rows``), so after
a crash a part is either complete or absent. A restart with the same fingerprint (input
prompts, model, sampling settings, batch size, seed) skips the batches already on disk; a
different fingerprint is an error instead of a silent mix of two runs. When every batch is
done the parts are joined with the input rows into ``OUT`` and the folder is removed.

Removing (after assembly, or on a restart with ``resume=false``) deletes only what a run writes
there — ``manifest.json``, the ``batch-NNNNNN.jsonl`` parts and their temporary files — each
as a regular file of the folder itself, never through a symbolic link; anything else put in
the folder stays, and so does the folder then. A folder that is itself a symbolic link is
refused.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hybridflow.data import DataFileError, read_rows, write_rows

MANIFEST = "manifest.json"
ROW = "row"
_PART = re.compile(r"^batch-(\d{6})\.jsonl$")
# What a run writes into the folder: the manifest, the parts, and their temporary files
# (``manifest.json.tmp``; write_rows' ``.batch-NNNNNN.jsonl.<random>.tmp``), left by a crash.
_OWN_FILE = re.compile(r"^(manifest\.json(\.tmp)?|batch-\d{6}\.jsonl|\.batch-\d{6}\.jsonl\.[^/]+\.tmp)$")


class GenerationJournal:
    """Part files of one run; ``fingerprint`` identifies the run's inputs and settings."""

    def __init__(self, output_path: str | os.PathLike, fingerprint: str, num_rows: int, batch_size: int) -> None:
        if num_rows < 1 or batch_size < 1:
            raise ValueError(f"num_rows and batch_size must be >= 1, got {num_rows}, {batch_size}")
        self.output_path = Path(output_path)
        self.folder = self.output_path.with_name(self.output_path.name + ".parts")
        self.num_rows, self.batch_size = num_rows, batch_size
        self.manifest: dict[str, Any] = {"fingerprint": fingerprint, "num_rows": num_rows, "batch_size": batch_size}

    @property
    def num_batches(self) -> int:
        return -(-self.num_rows // self.batch_size)

    def batch_rows(self, batch: int) -> range:
        """Input row indices of batch ``batch``."""
        size = self.batch_size
        return range(batch * size, min((batch + 1) * size, self.num_rows))

    def open(self, resume: bool) -> set[int]:
        """Prepare the folder; returns the batches already finished (empty unless resuming)."""
        if self.folder.is_symlink():
            raise DataFileError(
                f"{self.folder} is a symbolic link; the part files are written and deleted only in a real "
                "folder. Remove the link (or choose another data.output_path)"
            )
        if self.folder.exists() and not resume:
            self._remove_own_files()
        if not self.folder.exists() or not (self.folder / MANIFEST).exists():
            # a folder without a manifest holds no part of any run (the manifest is written first)
            self.folder.mkdir(parents=True, exist_ok=True)
            _write_json(self.folder / MANIFEST, self.manifest)
            return set()
        found = _read_manifest(self.folder / MANIFEST)
        if found != self.manifest:
            raise ValueError(
                f"{self.folder} holds an unfinished run with other inputs or settings ({found}); "
                "rerun with the same settings to finish it, or set resume=false to start over"
            )
        return {int(m.group(1)) for p in self.folder.iterdir() if (m := _PART.match(p.name))}

    def write_batch(self, batch: int, responses: Sequence[list[str]]) -> None:
        """Record the responses of every row of ``batch`` (atomically)."""
        rows = self.batch_rows(batch)
        if len(responses) != len(rows):
            raise ValueError(f"batch {batch} has {len(rows)} rows, got responses for {len(responses)}")
        write_rows(
            [{ROW: r, "responses": list(resp)} for r, resp in zip(rows, responses, strict=True)],
            self.folder / f"batch-{batch:06d}.jsonl",
        )

    def assemble(self, rows: Sequence[dict[str, Any]], response_key: str) -> Path:
        """Write ``rows`` with ``response_key`` = their responses to the output; remove the parts."""
        responses: dict[int, list[str]] = {}
        for batch in range(self.num_batches):
            part = self.folder / f"batch-{batch:06d}.jsonl"
            if not part.exists():
                raise DataFileError(f"{part}: missing; batch {batch} was never finished")
            for entry in read_rows(part):
                responses[int(entry[ROW])] = list(entry["responses"])
        if len(responses) != len(rows):
            raise DataFileError(f"{self.folder}: responses for {len(responses)} rows, the input has {len(rows)}")
        out = [{**row, response_key: responses[i]} for i, row in enumerate(rows)]
        path = write_rows(out, self.output_path)
        self._remove_own_files()
        return path

    def _remove_own_files(self) -> None:
        """Delete the files a run wrote into the folder, then the folder if nothing else is left.

        Only regular files whose names a run uses are removed (``unlink`` of a link would remove
        just the link, but a link is not something a run wrote either); the rest is the user's.
        """
        kept = []
        for entry in sorted(self.folder.iterdir()):
            if _OWN_FILE.match(entry.name) and entry.is_file() and not entry.is_symlink():
                entry.unlink()
            else:
                kept.append(entry.name + ("/" if entry.is_dir() and not entry.is_symlink() else ""))
        if kept:
            shown = ", ".join(kept[:5]) + (", ..." if len(kept) > 5 else "")
            print(f"{self.folder}: kept, it holds files this program did not write ({shown})")
        else:
            self.folder.rmdir()


def _write_json(path: Path, value: dict[str, Any]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(value, indent=2) + "\n", encoding="utf-8")
    tmp.replace(path)


def _read_manifest(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as err:
        raise DataFileError(f"{path}: unreadable manifest ({err}); delete {path.parent} to start over") from err
