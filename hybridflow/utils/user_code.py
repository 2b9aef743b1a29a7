"""Importing a user's Python file (a custom reward function, function tools) as a module.

The module is named ``<prefix>_<file stem>_<hash of the resolved path>`` and registered in
``sys.modules``, so objects defined in it pickle by reference (scorer processes, Ray) and two
files with the same name never collide. A file that fails to import leaves nothing behind.
"""

from __future__ import annotations

import hashlib
import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType


def user_module_name(file: Path, prefix: str) -> str:
    digest = hashlib.sha1(str(file.resolve()).encode()).hexdigest()[:10]
    stem = re.sub(r"\W", "_", file.stem)
    return f"{prefix}_{stem}_{digest}"


def import_user_file(file: Path, prefix: str, what: str, reuse: bool = False) -> ModuleType:
    """The module of ``file``; ``what`` names the config key in errors (``ImportError``).

    ``reuse``: return the module already imported from this file, if any, instead of running
    the file again.
    """
    name = user_module_name(file, prefix)
    if reuse and name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, file)
    if spec is None or spec.loader is None:
        raise ImportError(f"{what}: cannot import {file} as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        del sys.modules[name]
        raise ImportError(f"{what}: importing {file} failed: {type(exc).__name__}: {exc}") from exc
    return module
