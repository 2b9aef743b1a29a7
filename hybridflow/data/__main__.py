"""``python -m hybridflow.data TASK --out DIR [options]``: write a built-in task's files.

Writes ``DIR/train.parquet``, ``DIR/test.parquet`` and the same rows as ``.jsonl``, plus any
files of the task's own (``tool-lookup`` adds an SFT split and a ``tools.yaml``).
``hybridflow data ...`` is the same command.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from hybridflow.data.tasks import TASKS, write_task
from hybridflow.utils.errors import InputError, debug_enabled, one_paragraph


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hybridflow data", description="Write a built-in task's train/test files in verl's RL schema."
    )
    subparsers = parser.add_subparsers(dest="task", required=True, metavar="TASK")
    for name in TASKS.names():
        spec = TASKS.get(name)
        sub = subparsers.add_parser(name, help=spec.help, description=spec.help)
        sub.add_argument("--out", required=True, help="output folder (created if missing)")
        spec.add_arguments(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
    try:
        spec = TASKS.get(args.task)
        train_rows, test_rows = spec.build(args)
        paths = write_task(train_rows, test_rows, args.out)
        if spec.write_extra is not None:
            paths += spec.write_extra(args, Path(args.out).expanduser())
    except (ValueError, FileNotFoundError, InputError) as exc:  # bad sizes, settings or source rows
        if debug_enabled():
            raise
        print(f"hybridflow data {args.task}: error: {one_paragraph(exc)}", file=sys.stderr)
        return 2
    print(f"{args.task}: {len(train_rows)} train rows, {len(test_rows)} test rows")
    for path in paths:
        print(f"  wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
