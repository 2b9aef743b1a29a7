"""Inference: the built-in engine as a library object, and the token-level protocol to it.

``protocol.py`` holds the contract (:class:`SamplingParams`, :class:`TokenOutput`,
:class:`TokenClient`); ``generation.py`` / ``sampling.py`` / the decoders / ``continuous.py``
are the sampler; ``engine.py`` runs it on a background thread (``hybridflow serve`` is an HTTP
face on it, the rollout worker and agent loops are its clients); ``client.py`` holds the
in-process and HTTP :class:`TokenClient` s. Only the protocol is imported here, so importing
the package stays cheap (no torch).
"""

from hybridflow.inference.protocol import (
    STOP_REASONS,
    SamplingParams,
    StopReason,
    TokenClient,
    TokenOutput,
)

__all__ = ["STOP_REASONS", "SamplingParams", "StopReason", "TokenClient", "TokenOutput"]
