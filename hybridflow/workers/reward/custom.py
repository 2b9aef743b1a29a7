"""Load a user's scoring function from a Python file (``custom_reward_function.path`` / ``.name``).

The file is imported as a module named ``hybridflow_custom_reward_<stem>_<hash of the path>``
(registered in ``sys.modules``, so forked reward workers and pickling by reference find it)
and ``name`` is taken from it.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import os
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

MODULE_PREFIX = "hybridflow_custom_reward"


def load_custom_reward_function(
    path: str | os.PathLike | None, name: str = "compute_score", reward_kwargs: dict[str, Any] | None = None
) -> Callable[..., Any] | None:
    """The function ``name`` from the file at ``path`` (``None`` when ``path`` is ``None``).

    ``reward_kwargs`` are bound as keyword arguments (``functools.partial``). Errors name the
    file and the function: a missing file, a file that fails to import, a missing or
    non-callable attribute.
    """
    if path is None or path == "":
        return None
    file = Path(path)
    if not file.is_file():
        raise FileNotFoundError(f"custom_reward_function.path: no such file {file}")
    digest = hashlib.sha1(str(file.resolve()).encode()).hexdigest()[:10]
    module_name = f"{MODULE_PREFIX}_{_identifier(file.stem)}_{digest}"
    spec = importlib.util.spec_from_file_location(module_name, file)
    if spec is None or spec.loader is None:
        raise ImportError(f"custom_reward_function.path: cannot import {file} as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        del sys.modules[module_name]
        raise ImportError(f"custom_reward_function.path: importing {file} failed: {type(exc).__name__}: {exc}") from exc
    if not hasattr(module, name):
        available = sorted(k for k, v in vars(module).items() if callable(v) and not k.startswith("_"))
        raise AttributeError(
            f"custom_reward_function.name: {file} has no function {name!r}; callables there: {', '.join(available) or 'none'}"
        )
    fn = getattr(module, name)
    if not callable(fn):
        raise TypeError(f"custom_reward_function.name: {name!r} in {file} is a {type(fn).__name__}, not a function")
    return functools.partial(fn, **reward_kwargs) if reward_kwargs else fn


def _identifier(text: str) -> str:
    return re.sub(r"\W", "_", text)
