"""Reading tool calls out of a model's text, and telling the model how to write them.

A parser owns one call format in both directions: :meth:`ToolParser.parse` finds the calls
in one assistant turn, and :meth:`ToolParser.format_instructions` is the system-prompt text
that describes the tools and that format, used when a chat template ignores ``tools``.
Parsers register by name (``multi_turn.format``) in :data:`TOOL_PARSERS`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from hybridflow.utils.registry import Registry


@dataclass(frozen=True)
class ToolCall:
    """One call as the model wrote it: the tool's name and its arguments, either a mapping
    or the raw text the model put there (checked when the call runs, so a bad one becomes
    an error message the model reads)."""

    name: str
    arguments: Mapping[str, Any] | str


@dataclass(frozen=True)
class ParsedTurn:
    """One assistant turn: text outside the calls, the calls in order, and one description
    per call block that could not be read (skipped, and counted in the metrics)."""

    content: str
    calls: list[ToolCall] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


class ToolParser(ABC):
    """A tool-call format. Stateless: one instance may serve every trajectory."""

    name: str = ""

    @abstractmethod
    def parse(self, text: str) -> ParsedTurn:
        """The calls in ``text``, one assistant turn decoded with its special tokens."""

    @abstractmethod
    def format_instructions(self, tool_schemas: Sequence[Mapping[str, Any]]) -> str:
        """System-prompt text describing ``tool_schemas`` and how to call them in this format."""

    def split_calls(self, text: str) -> tuple[str, list[ToolCall]]:
        """For an API reply (``hybridflow serve``): ``text`` without its readable call blocks,
        and those calls. Unlike :meth:`parse`, nothing else is dropped: unreadable blocks and
        reasoning stay in the text. With no readable call, the text comes back unchanged.
        The default uses :meth:`parse` (which may drop more); formats override it."""
        parsed = self.parse(text)
        return (parsed.content, parsed.calls) if parsed.calls else (text, [])

    def format_calls(self, calls: Sequence[ToolCall]) -> str:
        """``calls`` written in this format, as the model would write them (to replay an
        assistant turn that called tools through a chat template that ignores tool calls)."""
        raise NotImplementedError(f"the {self.name!r} tool-call format cannot write calls back as text")


TOOL_PARSERS: Registry[type[ToolParser]] = Registry("tool parser")


def get_tool_parser(name: str) -> ToolParser:
    """A parser instance for format ``name`` (``ValueError`` listing the formats otherwise)."""
    return TOOL_PARSERS.get(name)()
