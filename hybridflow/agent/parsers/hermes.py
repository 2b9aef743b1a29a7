"""The ``hermes`` tool-call format (Qwen2.5, Hermes, SmolLM-style prompts).

A call is a JSON object in tags, one per call, any number per turn::

    <tool_call>
    {"name": "calculator", "arguments": {"expression": "12*7"}}
    </tool_call>

Rules here: a block whose JSON does not parse, is not an object, or has no string ``name``
is skipped and reported in :attr:`ParsedTurn.errors`; so is a ``<tool_call>`` left open at
the end of the turn. ``arguments`` may be an object or a string (kept as written, and
checked when the call runs); a missing ``arguments`` means no arguments. Anything inside
``<think>…</think>`` is reasoning, not a call — including an unclosed ``<think>`` and a
leading ``…</think>`` whose opening tag was in the prompt.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from hybridflow.agent.parsers.base import TOOL_PARSERS, ParsedTurn, ToolCall, ToolParser

CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
_CALL = re.compile(re.escape(CALL_OPEN) + r"(.*?)" + re.escape(CALL_CLOSE), re.DOTALL)
_THINK = re.compile(re.escape(THINK_OPEN) + r".*?" + re.escape(THINK_CLOSE), re.DOTALL)


def strip_thinking(text: str) -> str:
    """``text`` without its reasoning spans (closed, unclosed, or opened in the prompt)."""
    text = _THINK.sub("", text)
    if THINK_CLOSE in text:  # the opening tag was part of the prompt
        text = text[text.rindex(THINK_CLOSE) + len(THINK_CLOSE) :]
    if THINK_OPEN in text:  # still thinking when the turn ended
        text = text[: text.index(THINK_OPEN)]
    return text


@TOOL_PARSERS.register("hermes")
class HermesToolParser(ToolParser):
    """See the module docstring."""

    name = "hermes"

    def parse(self, text: str) -> ParsedTurn:
        visible = strip_thinking(text)
        calls: list[ToolCall] = []
        errors: list[str] = []
        for match in _CALL.finditer(visible):
            call, problem = _read_call(match.group(1))
            if call is not None:
                calls.append(call)
            else:
                errors.append(problem)
        content = _CALL.sub("", visible)
        if CALL_OPEN in content:
            errors.append(f"a {CALL_OPEN} was not closed with {CALL_CLOSE}")
            content = content[: content.index(CALL_OPEN)]
        return ParsedTurn(content=content.strip(), calls=calls, errors=errors)

    def split_calls(self, text: str) -> tuple[str, list[ToolCall]]:
        """Readable call blocks outside reasoning spans are taken out; the rest stays as written."""
        pieces: list[str] = []
        calls: list[ToolCall] = []
        for segment, thinking in _segments(text):
            if thinking:
                pieces.append(segment)
                continue
            at = 0
            for match in _CALL.finditer(segment):
                call, _ = _read_call(match.group(1))
                if call is not None:
                    pieces.append(segment[at : match.start()])
                    calls.append(call)
                    at = match.end()
            pieces.append(segment[at:])
        return ("".join(pieces).strip(), calls) if calls else (text, [])

    def format_calls(self, calls: Sequence[ToolCall]) -> str:
        blocks = []
        for call in calls:
            arguments = call.arguments
            if isinstance(arguments, str):
                try:
                    arguments = json.loads(arguments)
                except json.JSONDecodeError:
                    pass  # kept as the string it was
            payload = json.dumps({"name": call.name, "arguments": arguments}, ensure_ascii=False)
            blocks.append(f"{CALL_OPEN}\n{payload}\n{CALL_CLOSE}")
        return "\n".join(blocks)

    def format_instructions(self, tool_schemas: Sequence[Mapping[str, Any]]) -> str:
        listing = "\n".join(json.dumps(schema, ensure_ascii=False) for schema in tool_schemas)
        return (
            "You can call tools to help with the task. The tools are described by these JSON "
            f"schemas:\n<tools>\n{listing}\n</tools>\n\n"
            "To call a tool, write one JSON object with its name and arguments between "
            f"{CALL_OPEN} and {CALL_CLOSE} tags, for example:\n"
            f'{CALL_OPEN}\n{{"name": "<tool name>", "arguments": {{"<parameter>": <value>}}}}\n{CALL_CLOSE}\n'
            "The result comes back in the next message. Answer directly once you have what you need."
        )


def _segments(text: str) -> list[tuple[str, bool]]:
    """``text`` cut into (piece, is reasoning) pieces, reasoning as :func:`strip_thinking` sees it."""
    thinking = [False] * len(text)
    for match in _THINK.finditer(text):
        thinking[match.start() : match.end()] = [True] * (match.end() - match.start())
    stray_ends = [m.end() for m in re.finditer(re.escape(THINK_CLOSE), text) if not thinking[m.start()]]
    if stray_ends:  # the opening tag was part of the prompt
        thinking[: stray_ends[-1]] = [True] * stray_ends[-1]
    opens = [m.start() for m in re.finditer(re.escape(THINK_OPEN), text) if not thinking[m.start()]]
    if opens:  # still thinking when the turn ended
        thinking[opens[0] :] = [True] * (len(text) - opens[0])
    pieces: list[tuple[str, bool]] = []
    start = 0
    for i in range(1, len(text) + 1):
        if i == len(text) or thinking[i] != thinking[start]:
            pieces.append((text[start:i], thinking[start]))
            start = i
    return pieces


def _read_call(block: str) -> tuple[ToolCall | None, str]:
    snippet = block.strip()
    shown = snippet if len(snippet) <= 80 else snippet[:77] + "..."
    try:
        data = json.loads(snippet)
    except json.JSONDecodeError as exc:
        return None, f"not valid JSON ({exc.msg}): {shown}"
    if not isinstance(data, dict):
        return None, f"a JSON {type(data).__name__}, not an object with name and arguments: {shown}"
    name = data.get("name")
    if not isinstance(name, str) or not name:
        return None, f"no tool name (a string 'name' field): {shown}"
    arguments = data.get("arguments", {})
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, dict | str):
        return ToolCall(name=name, arguments=json.dumps(arguments)), ""
    return ToolCall(name=name, arguments=arguments), ""
