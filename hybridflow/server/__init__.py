"""An OpenAI-compatible generation server over the built-in sampler (``hybridflow serve``).

    hybridflow serve --model tiny-llama --port 8000
    # then: openai.OpenAI(base_url="http://127.0.0.1:8000/v1", api_key="none")

Endpoints: ``/v1/models``, ``/v1/completions``, ``/v1/chat/completions``, the token-in/token-out
``/generate``, ``/update_weights_from_disk``, ``/health`` and ``/metrics``. The server is an HTTP
face on the inference engine (:mod:`hybridflow.inference.generation_engine`): concurrent requests share
forward passes through its continuous batcher. See docs/server.md.

Names are imported on first use: the HTTP layer needs the ``serve`` extra (FastAPI, uvicorn),
and ``hybridflow serve`` must be able to say so instead of failing on import.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "ServerState": "hybridflow.server.state",
    "build_app": "hybridflow.server.app",
    "TextCodec": "hybridflow.server.text",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'hybridflow.server' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
