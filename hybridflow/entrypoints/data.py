"""``python -m hybridflow.entrypoints.data TASK --out DIR [options]``: write a built-in task's files.

Writes ``DIR/train.parquet``, ``DIR/test.parquet`` and the same rows as ``.jsonl``, plus any
files of the task's own (``tool-lookup`` adds an SFT split and a ``tools.yaml``).
``hybridflow data ...`` is the same command.
"""

from __future__ import annotations

import sys

from hybridflow.entrypoints.common import build_data_parser as build_parser
from hybridflow.entrypoints.common import write_builtin_task

__all__ = ["build_parser", "main"]


def main(argv: list[str] | None = None) -> int:
    return write_builtin_task(build_parser().parse_args(sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    sys.exit(main())
