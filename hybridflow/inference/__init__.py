"""Inference: the token-level protocol between generators and their clients.

``protocol.py`` holds the contract (:class:`SamplingParams`, :class:`TokenOutput`,
:class:`TokenClient`). The engine, in-process and HTTP clients move here in later steps.
"""

from hybridflow.inference.protocol import STOP_REASONS, SamplingParams, StopReason, TokenClient, TokenOutput

__all__ = ["STOP_REASONS", "SamplingParams", "StopReason", "TokenClient", "TokenOutput"]
