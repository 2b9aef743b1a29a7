"""What every route of ``hybridflow serve`` reads: the engine, the tokenizer, the model's limits, the policy.

:class:`ServerState` is built once at start (``hybridflow serve``'s entry point, or a test) and
handed to :func:`~hybridflow.server.app.build_app`; :class:`WeightUpload` is the one piece of it
that changes, the buckets of a weight push in progress (:mod:`hybridflow.server.control`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hybridflow.agent.parsers import ToolParser, get_tool_parser
from hybridflow.inference.generation_engine import GenerationEngine
from hybridflow.server.checks import ServerLimits
from hybridflow.server.security import default_allowed_hosts
from hybridflow.server.text import TextCodec

if TYPE_CHECKING:
    import torch


@dataclass
class WeightUpload:
    """The buckets of one ``/update_weights`` push received so far (one push at a time)."""

    update_id: str
    version: int
    next_bucket: int = 0
    staged: dict[str, torch.Tensor] = field(default_factory=dict)


@dataclass
class ServerState:
    """What the routes need: the engine, the tokenizer, the served model's limits, and the
    server's policy.

    ``eos_token_ids`` end every response unless ``ignore_eos``; ``default_max_tokens`` caps a
    reply when the request gives no limit; ``limits`` caps each request; ``weights_root`` is
    the only folder ``/update_weights_from_disk`` reads from (``None``: the route is off);
    ``allowed_hosts`` / ``api_key`` are checked on every request (see
    :mod:`hybridflow.server.security`); ``tool_parser`` reads tool calls out of chat replies
    when a request offers ``tools`` (``--tool-call-parser``); ``control_routes`` turns on
    the trainer's routes of :mod:`hybridflow.server.control` (``--control-routes``), whose
    weight pushes may be up to ``max_weight_bucket_bytes`` per request; ``control_token``
    (when set) is the bearer token those routes and ``/update_weights_from_disk`` need.
    ``processor``: the model folder's processor when it is a vision-language model (chat
    messages with ``image_url`` parts go through it, :mod:`hybridflow.server.images`); None
    for a text model, which refuses image parts.
    """

    engine: GenerationEngine
    codec: TextCodec
    model_name: str
    max_model_len: int
    eos_token_ids: tuple[int, ...]
    default_max_tokens: int = 512
    created: int = 0
    limits: ServerLimits = field(default_factory=ServerLimits)
    weights_root: Path | None = None
    allowed_hosts: frozenset[str] = field(default_factory=lambda: default_allowed_hosts("127.0.0.1"))
    api_key: str | None = None
    tool_parser: ToolParser = field(default_factory=lambda: get_tool_parser("hermes"))
    control_routes: bool = False
    max_weight_bucket_bytes: int = 512 * 1024 * 1024
    weight_upload: WeightUpload | None = None  # the buckets of the push in progress
    control_token: str | None = None
    processor: Any = None  # a vision-language model's processor: chat image_url parts need it
