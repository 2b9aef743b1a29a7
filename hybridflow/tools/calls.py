"""Running a model's tool calls for one trajectory: instances, timeouts, errors, truncation.

Everything that can go wrong in a call ends as text the model reads in a tool message, never
as an exception that would end the rollout step: an unknown tool name, arguments that are not
a JSON object, a tool that raises, a tool that does not finish in time, a tool whose
``create`` fails, a reward that is not a finite number. Long outputs are cut to
``max_tool_response_length`` characters on the configured side, so one chatty tool cannot eat
the response budget.

Tool code never runs on the agent loop's event loop: ``create``, ``execute`` and ``release``
run on the tool loop (:mod:`hybridflow.tools.tool_loop`), so the timeout holds even for a tool
that blocks without awaiting.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Literal

from hybridflow.tools.base import BaseTool
from hybridflow.tools.tool_loop import ToolTimeout, run_on_tool_loop
from hybridflow.utils.errors import InputError

logger = logging.getLogger(__name__)

TruncateSide = Literal["left", "right", "middle"]
TRUNCATE_SIDES: tuple[str, ...] = ("left", "right", "middle")
TRUNCATED = "...(truncated)"
_warned_unknown_kwargs: set[str] = set()


def truncate_tool_text(text: str, max_length: int, side: str = "middle") -> str:
    """Cut ``text`` to ``max_length`` characters plus a marker, as verl names the sides.

    The side names what is *kept*: ``left`` keeps the beginning (``abc...(truncated)``),
    ``right`` keeps the end (``(truncated)...xyz``), ``middle`` keeps both ends and drops
    the middle (``ab...(truncated)...yz``). Text within the limit is returned unchanged.
    """
    if side not in TRUNCATE_SIDES:
        raise ValueError(f"tool_response_truncate_side must be one of {', '.join(TRUNCATE_SIDES)}, got {side!r}")
    if max_length < 1:
        raise ValueError(f"max_tool_response_length must be >= 1, got {max_length}")
    if len(text) <= max_length:
        return text
    if side == "left":
        return text[:max_length] + TRUNCATED
    if side == "right":
        return "(truncated)..." + text[len(text) - max_length :]
    head = (max_length + 1) // 2
    tail = max_length - head
    return text[:head] + TRUNCATED + "..." + (text[len(text) - tail :] if tail else "")


class FatalToolError(InputError, RuntimeError):
    """A tool's answer that the run cannot use (e.g. images, which are not supported): raised
    out of the trajectory instead of becoming the model's error text, so the run stops with a
    message naming the tool."""


@dataclass(frozen=True)
class ToolCallResult:
    """One call's outcome: the (truncated) text for the model, the tool's step reward (None
    when the call failed or the tool gave none), its metrics, and whether it failed."""

    text: str
    reward: float | None = None
    metrics: dict[str, Any] = field(default_factory=dict)
    error: bool = False


def _error(text: str) -> ToolCallResult:
    return ToolCallResult(text=f"Error: {text}", error=True)


def _describe(exc: BaseException) -> str:
    message = str(exc)
    return f"{type(exc).__name__}: {message}" if message else type(exc).__name__


class ToolSession:
    """The tools as one trajectory sees them.

    ``tools_kwargs`` is the row's per-tool settings in verl's layout, ``{tool_name:
    {"create_kwargs": {...}}}``; each tool's instance is created on its first call with its
    ``create_kwargs`` and released by :meth:`release`. Calls may run concurrently; an
    instance is created once even when two calls of the same tool start together.
    ``timeout_s`` bounds each ``create``, ``execute`` and ``release`` (None: no bound): when it
    fires, the call is an error for the model and the trajectory goes on, even when the tool
    blocks without awaiting. Code that blocks cannot be killed, only abandoned (it runs on in
    the tool loop's thread), so a tool doing unbounded work needs its own hard limit (the
    python tool's sandbox, the calculator's size limits).
    """

    def __init__(
        self,
        tools: Mapping[str, BaseTool],
        tools_kwargs: Mapping[str, Any] | str | None = None,
        *,
        trajectory_id: str,
        max_tool_response_length: int = 256,
        tool_response_truncate_side: str = "middle",
        timeout_s: float | None = 60.0,
    ) -> None:
        truncate_tool_text("", max_tool_response_length, tool_response_truncate_side)  # validates both
        self.tools = dict(tools)
        self.tools_kwargs = _as_tools_kwargs(tools_kwargs)
        self.trajectory_id = trajectory_id
        self.max_tool_response_length = max_tool_response_length
        self.tool_response_truncate_side = tool_response_truncate_side
        self.timeout_s = timeout_s
        self._instances: dict[str, str] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        unknown = sorted(set(self.tools_kwargs) - set(self.tools))
        new = [name for name in unknown if name not in _warned_unknown_kwargs]
        if new:
            _warned_unknown_kwargs.update(new)
            logger.warning(
                "tools_kwargs names tool(s) %s that are not configured (configured: %s); their settings are ignored",
                ", ".join(new),
                ", ".join(sorted(self.tools)) or "none",
            )

    async def call(self, name: str, arguments: str | Mapping[str, Any]) -> ToolCallResult:
        """Run one call; every failure becomes an ``Error: ...`` text with ``error=True``."""
        tool = self.tools.get(name)
        if tool is None:
            available = ", ".join(sorted(self.tools)) or "none"
            return _error(f"unknown tool {name!r}; available tools: {available}")
        parameters, problem = _parse_arguments(arguments)
        if parameters is None:
            return _error(f'the arguments of {name!r} {problem}; pass a JSON object such as {{"x": 1}}')
        try:
            instance_id = await self._instance(tool)
        except ToolTimeout:
            return _error(f"tool {name!r} could not start within {self.timeout_s:g} s")
        except Exception as exc:  # noqa: BLE001 - any failure of the tool's code is the model's error text
            return _error(f"tool {name!r} could not start: {_describe(exc)}")
        try:
            outcome = await run_on_tool_loop(partial(tool.execute, instance_id, parameters), self.timeout_s)
        except FatalToolError:
            raise
        except ToolTimeout:
            return _error(f"tool {name!r} did not finish within {self.timeout_s:g} s")
        except Exception as exc:  # noqa: BLE001 - any failure of the tool's code is the model's error text
            return _error(f"tool {name!r} failed: {_describe(exc)}")
        try:
            text, reward, metrics = outcome
            reward = None if reward is None else float(reward)
        except (TypeError, ValueError):
            return _error(f"tool {name!r} returned {type(outcome).__name__}, not (text, reward, metrics)")
        except OverflowError:  # an int such as 10**400
            return _error(f"tool {name!r} returned a reward too large for a float, not a finite number")
        if reward is not None and not math.isfinite(reward):
            # a NaN or inf step reward would poison the trajectory's reward sum
            return _error(f"tool {name!r} returned the reward {reward}, not a finite number")
        text = text if isinstance(text, str) else str(text)
        text = truncate_tool_text(text, self.max_tool_response_length, self.tool_response_truncate_side)
        return ToolCallResult(text=text, reward=reward, metrics=dict(metrics or {}))

    async def _instance(self, tool: BaseTool) -> str:
        lock = self._locks.setdefault(tool.name, asyncio.Lock())
        async with lock:
            if tool.name not in self._instances:
                instance_id = f"{self.trajectory_id}:{tool.name}"
                create_kwargs = self.tools_kwargs.get(tool.name, {}).get("create_kwargs") or {}
                await run_on_tool_loop(partial(tool.create, instance_id, **create_kwargs), self.timeout_s)
                self._instances[tool.name] = instance_id
            return self._instances[tool.name]

    async def release(self) -> None:
        """Release every instance this trajectory created; a failing release is logged, not raised."""
        instances, self._instances = self._instances, {}
        for name, instance_id in instances.items():
            tool = self.tools[name]
            try:
                await run_on_tool_loop(partial(tool.release, instance_id), self.timeout_s)
            except Exception as exc:  # noqa: BLE001 - logged, and the other instances still released
                logger.warning("releasing tool %r instance %s failed: %s", name, instance_id, _describe(exc))


def _parse_arguments(arguments: str | Mapping[str, Any]) -> tuple[dict[str, Any] | None, str]:
    if isinstance(arguments, Mapping):
        return dict(arguments), ""
    if isinstance(arguments, str):
        if not arguments.strip():
            return {}, ""
        try:
            value = json.loads(arguments)
        except json.JSONDecodeError as exc:
            return None, f"are not valid JSON ({exc.msg} at character {exc.pos})"
        if isinstance(value, dict):
            return value, ""
        return None, f"are a JSON {type(value).__name__}, not an object"
    return None, f"are a {type(arguments).__name__}, not a JSON object"


def _as_tools_kwargs(value: Mapping[str, Any] | str | None) -> dict[str, dict[str, Any]]:
    """A row's ``tools_kwargs`` as a dict (it may arrive as a JSON string from a data file)."""
    if value is None:
        return {}
    if isinstance(value, str):
        value = json.loads(value) if value.strip() else {}
    if not isinstance(value, Mapping):
        raise ValueError(f"tools_kwargs must be a mapping of tool name to settings, got {type(value).__name__}")
    out: dict[str, dict[str, Any]] = {}
    for name, settings in value.items():
        if settings is None:
            continue
        if not isinstance(settings, Mapping):
            raise ValueError(f"tools_kwargs[{name!r}] must be a mapping like {{'create_kwargs': {{...}}}}")
        out[str(name)] = dict(settings)
    return out
