"""An OpenAI-compatible generation server over the built-in sampler (``hybridflow serve``).

    hybridflow serve --model tiny-llama --port 8000
    # then: openai.OpenAI(base_url="http://127.0.0.1:8000/v1", api_key="none")

Endpoints: ``/v1/models``, ``/v1/completions``, ``/v1/chat/completions``, the token-in/token-out
``/generate``, ``/update_weights_from_disk``, ``/health`` and ``/metrics``. Concurrent requests
share forward passes through the continuous batcher
(:mod:`hybridflow.workers.rollout.continuous`). See docs/server.md.
"""

from hybridflow.server.app import ServerState, build_app
from hybridflow.server.engine import GenerationEngine
from hybridflow.server.text import TextCodec
from hybridflow.server.weights import load_weights_from_folder

__all__ = ["GenerationEngine", "ServerState", "TextCodec", "build_app", "load_weights_from_folder"]
