"""Agent loops: the interface, one trajectory's output, and the name → loop table.

An agent loop turns one prompt row into one trajectory by talking to a
:class:`~hybridflow.inference.protocol.TokenClient` in token ids. A fresh loop instance runs
each trajectory, so a loop may keep per-trajectory state on ``self``.

Loops are chosen per row by the ``agent_name`` column. Built-in loops register in
:data:`AGENT_LOOPS` (``single_turn_agent``, ``tool_agent``); user loops come from verl's
``actor_rollout_ref.rollout.agent.agent_loop_config_path``, a YAML list::

    - name: my_agent
      _target_: my_package.loops.MyAgentLoop
      max_steps: 4            # any other key is a keyword argument of the class

:func:`agent_loop_table` merges both into one :class:`~hybridflow.utils.registry.Registry`
of :class:`AgentLoopSpec`; a YAML name that is already taken is an error, as is a class
that does not derive from :class:`AgentLoopBase` or does not accept the keyword arguments.
"""

from __future__ import annotations

import importlib
import inspect
import os
import uuid
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from hybridflow import fields as F
from hybridflow.agent.images import VisionTokens
from hybridflow.inference.protocol import SamplingParams, TokenClient
from hybridflow.tools.base import BaseTool
from hybridflow.utils.errors import InputError
from hybridflow.utils.registry import Registry


class AgentLoopConfigError(InputError, ValueError):
    """An agent loop configuration that cannot be used; the message names the file and entry."""


@dataclass
class AgentLoopOutput:
    """One trajectory in token ids.

    ``response_ids`` is everything after the prompt: model tokens and the context inserted
    between turns (tool results, separators). ``response_mask`` is 1 on model tokens and 0 on
    inserted ones; ``response_log_probs`` holds the sampler's log-prob of each model token and
    0.0 on inserted ones. ``num_turns`` counts the prompt's user turn, every assistant turn
    and every tool/user turn appended (verl's count). ``tool_call_counts`` is the number of
    tool calls run; ``turn_scores`` and ``tool_rewards`` the per-turn and per-call rewards;
    ``metrics`` per-trajectory timings (``generate_sequences``, ``tool_calls`` in seconds)
    and counters.
    """

    prompt_ids: list[int]
    response_ids: list[int]
    response_mask: list[int]
    response_log_probs: list[float]
    num_turns: int
    tool_call_counts: int = 0
    turn_scores: list[float] = field(default_factory=list)
    tool_rewards: list[float] = field(default_factory=list)
    metrics: dict[str, float] = field(default_factory=dict)
    prompt_positions: Any = None  # a prompt with images: its 3-D positions (3, len(prompt_ids)), a tensor


@dataclass(frozen=True)
class AgentContext:
    """What every loop of a run shares: the client, the tokenizer (with its chat template),
    the response budget in tokens (model and inserted tokens together), the run's tools,
    keyword arguments for ``apply_chat_template``, and — for a vision-language model whose
    client takes images — its :class:`~hybridflow.agent.images.VisionTokens` (None: rows with
    images are refused)."""

    client: TokenClient
    tokenizer: Any
    response_length: int
    tools: Mapping[str, BaseTool] = field(default_factory=dict)
    chat_template_kwargs: Mapping[str, Any] = field(default_factory=dict)
    vision: VisionTokens | None = None

    def __post_init__(self) -> None:
        if self.response_length < 1:
            raise ValueError(f"response_length must be >= 1, got {self.response_length}")


class VersionRecorder:
    """A trajectory's view of the client: every call goes through, and the weight versions
    that produced its tokens are kept (the first token's, the last token's), so a trajectory
    resumed across a weight update (partial rollout) reports both."""

    def __init__(self, client: Any) -> None:
        self.inner = client
        self.min_version: int | None = None
        self.max_version: int | None = None

    async def generate(self, *args: Any, **kwargs: Any) -> Any:
        out = await self.inner.generate(*args, **kwargs)
        if out.token_ids:
            first = out.weight_version if out.first_weight_version is None else out.first_weight_version
            self.min_version = first if self.min_version is None else min(self.min_version, first)
            self.max_version = (
                out.weight_version if self.max_version is None else max(self.max_version, out.weight_version)
            )
        return out

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


class AgentLoopBase(ABC):
    """One trajectory's program. Subclasses take ``(context, **their own keyword arguments)``.

    ``run`` receives the sampling settings and the row's non-tensor columns as keyword
    arguments (``raw_prompt``, ``raw_prompt_ids``, ``tools_kwargs``, ``extra_info``, ...);
    a loop takes the ones it needs and ignores the rest.
    """

    def __init__(self, context: AgentContext) -> None:
        self.context = context
        self.client = VersionRecorder(context.client)
        self.tokenizer = context.tokenizer
        self.response_length = context.response_length
        self.request_id = uuid.uuid4().hex

    @abstractmethod
    async def run(self, sampling: SamplingParams, **row: Any) -> AgentLoopOutput:
        """Produce the trajectory for one row."""


def row_messages(row: Mapping[str, Any], loop_name: str) -> list[dict[str, Any]]:
    """The row's ``raw_prompt`` chat messages as a list of dicts (a data file may give a numpy array)."""
    messages = row.get("raw_prompt")
    if messages is None or isinstance(messages, str | bytes | Mapping):
        raise ValueError(f"{loop_name} needs the row's raw_prompt: a list of chat messages (role, content)")
    items = list(messages)
    if not items or not all(isinstance(m, Mapping) for m in items):
        raise ValueError(f"{loop_name}: raw_prompt must be a non-empty list of chat messages (role, content)")
    return [dict(m) for m in items]


def has_images(row: Mapping[str, Any]) -> bool:
    """Whether a row carries image inputs (a non-empty ``multi_modal_inputs``)."""
    return bool(row.get(F.MULTI_MODAL_INPUTS))


def refuse_images(row: Mapping[str, Any], loop_name: str) -> None:
    """A clear error for an image row reaching a loop that does not pass images to its client
    (a user loop may call it): its image tokens would be fed without the pixels. The built-in
    loops pass them (``hybridflow/agent/images.py``)."""
    if has_images(row):
        raise ValueError(
            f"{loop_name} cannot take rows with images: it sends token ids only, without the pixels; "
            "single_turn_agent and tool_agent on the built-in rollout (rollout.name=torch) take image rows"
        )


AGENT_LOOPS: Registry[type[AgentLoopBase]] = Registry("agent loop")
"""Built-in loops by name; ``@AGENT_LOOPS.register("name")`` on the class."""


@dataclass(frozen=True)
class AgentLoopSpec:
    """A loop class with the keyword arguments its YAML entry gave (none for built-ins)."""

    name: str
    cls: type[AgentLoopBase]
    kwargs: Mapping[str, Any] = field(default_factory=dict)

    def build(self, context: AgentContext, **overrides: Any) -> AgentLoopBase:
        """A fresh loop for one trajectory: ``cls(context, **kwargs, **overrides)``."""
        return self.cls(context, **{**self.kwargs, **overrides})


def _import_loop_class(dotted: str, where: str) -> type[AgentLoopBase]:
    module_name, _, attr = dotted.rpartition(".")
    if not module_name:
        raise AgentLoopConfigError(
            f"{where}: _target_ {dotted!r} is not a dotted class path like 'package.module.Class'"
        )
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        raise AgentLoopConfigError(
            f"{where}: cannot import module {module_name!r} ({type(exc).__name__}: {exc})"
        ) from exc
    cls = getattr(module, attr, None)
    if cls is None:
        raise AgentLoopConfigError(f"{where}: module {module_name!r} has no attribute {attr!r}")
    if not (isinstance(cls, type) and issubclass(cls, AgentLoopBase)):
        raise AgentLoopConfigError(f"{where}: {dotted} is not a subclass of hybridflow.agent.base.AgentLoopBase")
    return cls


def _check_kwargs(cls: type[AgentLoopBase], kwargs: Mapping[str, Any], where: str) -> None:
    """Bind ``(context, **kwargs)`` to the constructor now, so a typo fails at start-up."""
    try:
        inspect.signature(cls).bind(None, **kwargs)
    except TypeError as exc:
        raise AgentLoopConfigError(f"{where}: {cls.__qualname__} does not accept these arguments: {exc}") from exc


def load_agent_loop_config(path: str | os.PathLike[str]) -> list[AgentLoopSpec]:
    """The loops of a verl ``agent_loop_config_path`` file, in file order."""
    file = Path(path).expanduser()
    if not file.is_file():
        raise FileNotFoundError(f"agent_loop_config_path: no such file {file}")
    try:
        data = yaml.safe_load(file.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise AgentLoopConfigError(f"agent_loop_config_path: {file} is not valid YAML: {exc}") from exc
    if not isinstance(data, list):
        raise AgentLoopConfigError(f"{file}: an agent loop config is a YAML list of entries with name and _target_")
    specs: list[AgentLoopSpec] = []
    seen: set[str] = set()
    for i, entry in enumerate(data):
        where = f"{file}: entry {i}"
        if not isinstance(entry, Mapping):
            raise AgentLoopConfigError(f"{where} must be a mapping with name and _target_")
        name, target = entry.get("name"), entry.get("_target_")
        if not isinstance(name, str) or not name:
            raise AgentLoopConfigError(f"{where}: 'name' is missing")
        if not isinstance(target, str) or not target:
            raise AgentLoopConfigError(f"{where} ({name}): '_target_' (the loop's class path) is missing")
        if name in seen:
            raise AgentLoopConfigError(f"{where}: agent loop name {name!r} appears twice in the file")
        seen.add(name)
        kwargs = {k: v for k, v in entry.items() if k not in ("name", "_target_")}
        cls = _import_loop_class(target, f"{where} ({name})")
        _check_kwargs(cls, kwargs, f"{where} ({name})")
        specs.append(AgentLoopSpec(name=name, cls=cls, kwargs=kwargs))
    return specs


def agent_loop_table(
    agent_loop_config_path: str | os.PathLike[str] | None = None,
    builtin_kwargs: Mapping[str, Mapping[str, Any]] | None = None,
) -> Registry[AgentLoopSpec]:
    """Every loop of a run by name: the built-ins (with ``builtin_kwargs[name]``, e.g. the
    ``multi_turn`` settings for ``tool_agent``), then the YAML file's."""
    table: Registry[AgentLoopSpec] = Registry("agent loop")
    builtin_kwargs = dict(builtin_kwargs or {})
    unknown = sorted(set(builtin_kwargs) - set(AGENT_LOOPS.names()))
    if unknown:
        raise ValueError(f"builtin_kwargs names unknown agent loop(s) {unknown}; built-ins: {AGENT_LOOPS.names()}")
    for name in AGENT_LOOPS.names():
        cls = AGENT_LOOPS.get(name)
        kwargs = dict(builtin_kwargs.get(name, {}))
        _check_kwargs(cls, kwargs, f"built-in agent loop {name!r}")
        table.add(name, AgentLoopSpec(name=name, cls=cls, kwargs=kwargs))
    if agent_loop_config_path:
        for spec in load_agent_loop_config(agent_loop_config_path):
            if spec.name in table:
                taken = table.get(spec.name).cls
                raise AgentLoopConfigError(
                    f"{agent_loop_config_path}: agent loop name {spec.name!r} is already taken by "
                    f"{taken.__module__}.{taken.__qualname__}; choose another name"
                )
            table.add(spec.name, spec)
    return table
