"""Load a user's scoring function from a Python file (``custom_reward_function.path`` / ``.name``).

The file is imported as a module named ``hybridflow_custom_reward_<stem>_<hash of the path>``
(registered in ``sys.modules``, so pickling by reference finds it) and ``name`` is taken from it.

:func:`load_custom_reward_function` imports the file here and now. A
:class:`CustomRewardFunction` names the file and function without importing anything: the
reward managers' scorer processes import it themselves (with the reward timeout and memory
limit, see ``scorer_process.py``), so the file's module-level code never runs in the trainer.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hybridflow.utils.user_code import import_user_file

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
    module = import_user_file(file, MODULE_PREFIX, "custom_reward_function.path")
    if not hasattr(module, name):
        available = sorted(k for k, v in vars(module).items() if callable(v) and not k.startswith("_"))
        raise AttributeError(
            f"custom_reward_function.name: {file} has no function {name!r}; callables there: {', '.join(available) or 'none'}"
        )
    fn = getattr(module, name)
    if not callable(fn):
        raise TypeError(f"custom_reward_function.name: {name!r} in {file} is a {type(fn).__name__}, not a function")
    return functools.partial(fn, **reward_kwargs) if reward_kwargs else fn


# (resolved path, name) → the function, per process: each scorer process imports a file once.
_LOADED: dict[tuple[str, str], Callable[..., Any]] = {}


@dataclass(frozen=True, eq=False)  # compared and hashed by identity: reward_kwargs is a dict
class CustomRewardFunction:
    """The function ``name`` in the file at ``path``, imported by :meth:`load` where it is needed.

    Calling it loads it in the calling process first (once per process). Picklable, so it can
    be sent to a scorer process made by ``spawn``. A missing file is an error at once.
    """

    path: str
    name: str = "compute_score"
    reward_kwargs: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not Path(self.path).is_file():
            raise FileNotFoundError(f"custom_reward_function.path: no such file {self.path}")

    def load(self) -> Callable[..., Any]:
        """Import the file in this process (the first time) and return the bound function."""
        key = (str(Path(self.path).resolve()), self.name)
        if key not in _LOADED:
            loaded = load_custom_reward_function(self.path, self.name)
            assert loaded is not None  # self.path names a file (checked in __post_init__)
            _LOADED[key] = loaded
        fn = _LOADED[key]
        return functools.partial(fn, **self.reward_kwargs) if self.reward_kwargs else fn

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.load()(*args, **kwargs)

    def __str__(self) -> str:
        return f"{self.name!r} from {self.path}"
