"""vLLM and SGLang behind the :class:`~hybridflow.inference.protocol.InferenceServer` protocol.

``actor_rollout_ref.rollout.name`` picks the engine; :data:`ENGINE_PACKAGES` maps the names
served by an external package to that package (see :mod:`hybridflow.utils.optional_engines`).
Neither package is imported here (nor when the adapter modules are imported): each adapter
imports its engine in its constructor, so this package imports on a machine that has neither
(they need a CUDA GPU). What both adapters share is in :mod:`.common`; the adapters are
:mod:`.vllm` and :mod:`.sglang`.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from hybridflow.utils.optional_engines import (
    ENGINE_PACKAGES,
    EngineNotInstalled,
    check_engine_installed,
    engine_available,
    import_failed,
    missing_engine_message,
)

if TYPE_CHECKING:
    from hybridflow.inference.protocol import InferenceServer

__all__ = [
    "ENGINE_PACKAGES",
    "EngineNotInstalled",
    "check_engine_installed",
    "engine_available",
    "import_failed",
    "make_adapter",
    "missing_engine_message",
]


def make_adapter(name: str, model_path: str | Path, **engine_kwargs: Any) -> InferenceServer:
    """The adapter for engine ``name`` serving ``model_path`` (an HF folder); ``engine_kwargs``
    go to the engine's own constructor (``AsyncEngineArgs`` / ``sglang.Engine``)."""
    if name not in ENGINE_PACKAGES:
        raise ValueError(f"no adapter for engine {name!r}; adapters exist for {', '.join(sorted(ENGINE_PACKAGES))}")
    check_engine_installed(name)
    if name == "vllm":
        from hybridflow.inference.adapters.vllm import VLLMServer

        return VLLMServer(model_path, **engine_kwargs)
    from hybridflow.inference.adapters.sglang import SGLangServer

    return SGLangServer(model_path, **engine_kwargs)
