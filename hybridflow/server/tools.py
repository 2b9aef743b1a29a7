"""OpenAI tool calling for ``/v1/chat/completions``: tools into the prompt, calls out of the reply.

In: ``tools`` go to the chat template (``tools=``). A template that ignores them (SmolLM2's
ChatML does) gets them described in the system prompt exactly as the agent loop does
(:func:`~hybridflow.agent.tool_agent.with_tool_instructions` with the parser's
:meth:`~hybridflow.agent.parsers.ToolParser.format_instructions`), and earlier assistant
``tool_calls`` are written into that turn's text in the parser's format, so the model sees
its own past calls as it would have written them.

Out: the reply text is split by the server's ``--tool-call-parser``
(:meth:`~hybridflow.agent.parsers.ToolParser.split_calls`); readable calls become OpenAI
``tool_calls``, everything else (malformed blocks included) stays in ``content``.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from typing import Any

from hybridflow.agent.parsers import ToolCall, ToolParser
from hybridflow.agent.tool_agent import with_tool_instructions
from hybridflow.server.checks import BadRequest

TOOL_CHOICES = ("auto", "none")


def check_tools(tools: Sequence[dict[str, Any]] | None, tool_choice: Any) -> None:
    """400 for a tool list that is not OpenAI function tools, or a ``tool_choice`` we cannot honour."""
    for i, tool in enumerate(tools or ()):
        function = tool.get("function")
        if (
            tool.get("type") != "function"
            or not isinstance(function, dict)
            or not isinstance(function.get("name"), str)
            or not function["name"]
        ):
            raise BadRequest(
                f"tools.{i}: expected {{'type': 'function', 'function': {{'name': ..., 'parameters': ...}}}}",
                f"tools.{i}",
            )
    if tool_choice is None or tool_choice in TOOL_CHOICES:
        return
    if tool_choice == "required" or isinstance(tool_choice, dict):
        raise BadRequest(
            "tool_choice other than 'auto' or 'none' is not supported (this server does not constrain "
            "generation to force a tool call); send 'auto'",
            "tool_choice",
        )
    raise BadRequest(f"tool_choice must be 'auto' or 'none', got {tool_choice!r}", "tool_choice")


def _arguments(value: Any) -> Any:
    """OpenAI sends arguments as a JSON string; chat templates expect the object."""
    if isinstance(value, str):
        try:
            return json.loads(value)
        except json.JSONDecodeError:
            return value
    return value


def template_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Assistant ``tool_calls`` checked and with their arguments as objects (HF template convention)."""
    out = []
    for i, message in enumerate(messages):
        calls = message.get("tool_calls")
        if calls is None:
            out.append(message)
            continue
        if message.get("role") != "assistant" or not isinstance(calls, list):
            raise BadRequest(f"messages.{i}: tool_calls must be a list on an assistant message", f"messages.{i}")
        fixed = []
        for j, call in enumerate(calls):
            function = call.get("function") if isinstance(call, dict) else None
            if not isinstance(function, dict) or not isinstance(function.get("name"), str):
                raise BadRequest(
                    f"messages.{i}.tool_calls.{j}: expected {{'id': ..., 'type': 'function', "
                    "'function': {'name': ..., 'arguments': '<JSON>'}}",
                    f"messages.{i}",
                )
            fixed.append({**call, "function": {**function, "arguments": _arguments(function.get("arguments", {}))}})
        out.append({**message, "tool_calls": fixed})
    return out


def calls_as_text(messages: list[dict[str, Any]], parser: ToolParser) -> list[dict[str, Any]]:
    """Assistant ``tool_calls`` written into the turn's text in ``parser``'s format (for a
    template that ignores them); the ``tool_calls`` key is dropped."""
    out = []
    for message in messages:
        if not message.get("tool_calls"):
            out.append(message)
            continue
        calls = [ToolCall(c["function"]["name"], c["function"].get("arguments") or {}) for c in message["tool_calls"]]
        text = message.get("content") or ""
        written = parser.format_calls(calls)
        rest = {k: v for k, v in message.items() if k != "tool_calls"}
        out.append({**rest, "content": f"{text}\n{written}" if text else written})
    return out


def describe_tools(messages: list[dict[str, Any]], tools: Sequence[dict[str, Any]], parser: ToolParser) -> list[dict]:
    """The agent loop's system-prompt description of ``tools`` (for a template that ignores them)."""
    return with_tool_instructions(messages, parser.format_instructions(tools))


def openai_tool_calls(calls: Sequence[ToolCall]) -> list[dict[str, Any]]:
    """Parsed calls in OpenAI's shape; ``arguments`` is a JSON string."""
    out = []
    for call in calls:
        arguments = (
            call.arguments if isinstance(call.arguments, str) else json.dumps(dict(call.arguments), ensure_ascii=False)
        )
        out.append(
            {
                "id": f"call_{uuid.uuid4().hex[:24]}",
                "type": "function",
                "function": {"name": call.name, "arguments": arguments},
            }
        )
    return out


def split_reply(text: str, parser: ToolParser | None) -> tuple[str | None, list[dict[str, Any]]]:
    """(content, OpenAI tool_calls) of a reply; without calls the text is returned unchanged."""
    if parser is None:
        return text, []
    content, calls = parser.split_calls(text)
    if not calls:
        return text, []
    return (content or None), openai_tool_calls(calls)
