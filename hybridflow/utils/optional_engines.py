"""Rollout engines that come from optional packages (vLLM, SGLang): are they installed here?

Lives at the bottom of the layer stack because the config rules ask it at load time
(``rollout.name=vllm`` on a machine without vLLM fails there, naming the package), and the
adapters in :mod:`hybridflow.inference.adapters` ask it before importing their engine. Nothing
here imports the packages: finding them is enough, and importing vLLM initialises CUDA.
"""

from __future__ import annotations

import importlib.util

from hybridflow.utils.errors import InputError

ENGINE_PACKAGES: dict[str, str] = {"vllm": "vllm", "sglang": "sglang"}


class EngineNotInstalled(InputError, ValueError):
    """``rollout.name`` names an engine whose package is not installed here."""


def engine_available(name: str) -> bool:
    """Whether the package behind ``name`` can be found, without importing it (the import
    of vLLM / SGLang takes seconds and initialises CUDA)."""
    package = ENGINE_PACKAGES.get(name, name)
    try:
        return importlib.util.find_spec(package) is not None
    except (ImportError, ValueError):  # a broken parent package, or a module with __spec__ None
        return False


def missing_engine_message(name: str) -> str:
    package = ENGINE_PACKAGES[name]
    return (
        f"actor_rollout_ref.rollout.name={name} needs the `{package}` package, which is not installed "
        f"(pip install {package}; it needs a CUDA GPU). On a CPU use rollout.name=torch (the built-in engine)."
    )


def check_engine_installed(name: str) -> None:
    """Raise :class:`EngineNotInstalled` (a ``ValueError``) when ``name`` is an external engine
    whose package is missing; other names (the built-in ``torch`` …) pass."""
    if name in ENGINE_PACKAGES and not engine_available(name):
        raise EngineNotInstalled(missing_engine_message(name))


def import_failed(name: str, err: ImportError) -> ImportError:
    """The error for a package that is found but does not import (a broken or CPU-only build)."""
    return ImportError(
        f"the `{ENGINE_PACKAGES[name]}` package is installed but failed to import ({err}); "
        f"rollout.name={name} needs a working CUDA build of it"
    )
