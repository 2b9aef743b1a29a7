"""What several entry points share: the device choice, the data files' checks, built-in tasks.

A data file that is missing at a built-in task's default path (``~/data/hybridflow/<task>/...``)
is written on first use, by the same code as ``hybridflow data <task> --out <folder>``, but only
after every file the user named was found and read (see :func:`build_datasets_validated`).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from hybridflow.data.tasks import TASKS, write_task
from hybridflow.data.tasks.common import apply_prompt_template
from hybridflow.utils.errors import InputError, debug_enabled, one_paragraph

BUILTIN_DATA_ROOT = Path("~/data/hybridflow").expanduser()
T = TypeVar("T")


def resolve_device(device: str) -> str:
    """``auto`` → ``cuda`` if a GPU is available, else ``cpu``; any other name as given."""
    if device == "auto":
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


# --- built-in task files -------------------------------------------------------------------


def build_data_parser() -> argparse.ArgumentParser:
    """The ``hybridflow data`` parser: one subcommand per built-in task, each with ``--out``."""
    parser = argparse.ArgumentParser(
        prog="hybridflow data", description="Write a built-in task's train/test files in verl's RL schema."
    )
    subparsers = parser.add_subparsers(dest="task", required=True, metavar="TASK")
    for name in TASKS.names():
        spec = TASKS.get(name)
        sub = subparsers.add_parser(name, help=spec.help, description=spec.help)
        sub.add_argument("--out", required=True, help="output folder (created if missing)")
        sub.add_argument(
            "--prompt-template",
            default=None,
            help="wrap each user message: '{question}' marks where it goes, e.g. 'Question: {question}\\nAnswer:' "
            "(\\n is a newline); for base models trained with data.apply_chat_template=false",
        )
        spec.add_arguments(sub)
    return parser


def write_builtin_task(args: argparse.Namespace) -> int:
    """Write the task's files as parsed by :func:`build_data_parser`; prints what it wrote.
    Exit status: 0, or 2 with one message for bad sizes, settings or source rows."""
    try:
        spec = TASKS.get(args.task)
        train_rows, test_rows = spec.build(args)
        if args.prompt_template is not None:
            template = args.prompt_template.replace("\\n", "\n")
            train_rows, test_rows = (
                apply_prompt_template(train_rows, template),
                apply_prompt_template(test_rows, template),
            )
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


def _builtin_task_to_write(file: str) -> Path | None:
    """The folder of the built-in task to write for ``file`` (a missing default path
    ``~/data/hybridflow/<task>/...``), or None."""
    path = Path(file).expanduser()
    if path.exists() or path.parent.parent != BUILTIN_DATA_ROOT or path.parent.name not in TASKS:
        return None
    return path.parent


def ensure_builtin_task_files(files: tuple[str, ...]) -> None:
    """Write a built-in task on first use when a default path ``~/data/hybridflow/<task>/...`` is missing."""
    for file in files:
        folder = _builtin_task_to_write(file)
        if folder is None or Path(file).expanduser().exists():  # an earlier file of the list wrote it
            continue
        print(f"{Path(file).expanduser()} not found: writing the built-in {folder.name!r} task there")
        if write_builtin_task(build_data_parser().parse_args([folder.name, "--out", str(folder)])) != 0:
            raise RuntimeError(f"could not write the built-in task files into {folder}")


# --- data files ----------------------------------------------------------------------------


def check_data_files(files_by_key: dict[str, tuple[str, ...]]) -> None:
    """Every data file exists or is a built-in task's default path; an error names the key."""
    for key, files in files_by_key.items():
        for file in files:
            if not Path(file).expanduser().exists() and _builtin_task_to_write(file) is None:
                raise FileNotFoundError(f"{key}: {file} does not exist")


def build_datasets_validated(
    files_by_key: dict[str, tuple[str, ...]], build: Callable[[str, list[str]], T]
) -> dict[str, T]:
    """``build(key, files)`` for each config key's files, validating before anything is written:
    every file is checked, the datasets of the user's own files are built (their rows checked)
    first, and only then are missing built-in tasks written and their datasets built."""
    check_data_files(files_by_key)
    waiting = {key: files for key, files in files_by_key.items() if any(_builtin_task_to_write(f) for f in files)}
    built = {key: build(key, list(files)) for key, files in files_by_key.items() if key not in waiting}
    for key, files in waiting.items():
        ensure_builtin_task_files(files)
        built[key] = build(key, list(files))
    return {key: built[key] for key in files_by_key}
