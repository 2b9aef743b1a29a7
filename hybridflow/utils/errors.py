"""Bad input is reported as one clean paragraph and exit code 2, not a traceback.

Errors raised because of what the user gave — a config, a data file or row, a model folder, a
checkpoint — derive from :class:`InputError` (the config, data, model and checkpoint error
classes do, alongside their ``ValueError`` / ``RuntimeError`` bases). Every entry point runs
its body through :func:`run_main`, which turns an ``InputError`` (or a missing file) into
``"<prog>: <message>"`` on stderr and exit code 2, as config errors always were. Anything else
is a bug or an environment problem and keeps its traceback.

``HYBRIDFLOW_DEBUG=1`` (or verl's ``HYDRA_FULL_ERROR=1``, or ``hybridflow --debug ...``)
re-raises input errors too, with the full traceback.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any

DEBUG_ENV: tuple[str, ...] = ("HYBRIDFLOW_DEBUG", "HYDRA_FULL_ERROR")
EXIT_BAD_INPUT = 2


class InputError(Exception):
    """Raised for bad user input; its message alone must say what is wrong and where."""


def debug_enabled() -> bool:
    return any(os.environ.get(name, "").strip() not in ("", "0") for name in DEBUG_ENV)


def run_main(prog: str, body: Callable[[], int | None]) -> int:
    """``body()``'s exit code; an input error (or a missing file) is printed and gives 2."""
    try:
        return int(body() or 0)
    except Exception as exc:
        cause = input_cause(exc)
        if cause is None or debug_enabled():
            raise
        where = f"{exc.rank_label()}: " if cause is not exc and hasattr(exc, "rank_label") else ""
        print(f"{prog}: {where}{one_paragraph(cause)}", file=sys.stderr)
        print(f"(set {DEBUG_ENV[0]}=1 for the traceback)", file=sys.stderr)
        return EXIT_BAD_INPUT


def input_cause(exc: BaseException) -> BaseException | None:
    """The input error behind ``exc``: itself, or the one a worker raised and a worker-group
    error carried back (``exc.cause``, e.g. a model whose weights give NaN logits)."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, (InputError, FileNotFoundError)):
            return current
        seen.add(id(current))
        current = getattr(current, "cause", None)
    return None


def one_paragraph(exc: BaseException) -> str:
    """The message on one line: an input error says everything itself; for another error (a
    missing file, a ``ValueError`` from a library) its type is kept so the reader can place it."""
    text = str(exc).strip()
    if isinstance(exc, FileNotFoundError) and exc.filename:
        return f"file not found: {exc.filename}"
    if isinstance(exc, (InputError, FileNotFoundError)):
        return text or type(exc).__name__
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def short_repr(value: Any, limit: int = 80) -> str:
    """``repr(value)`` cut to ``limit`` characters, for an error message about a bad value (an
    int past Python's digit limit for ``str()`` cannot even be shown)."""
    try:
        text = repr(value)
    except ValueError:
        return "(too long to show)"
    return text if len(text) <= limit else text[: limit - 3] + "..."
