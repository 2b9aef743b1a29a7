"""Tool-call parsers by format name (``multi_turn.format``): ``hermes``."""

from hybridflow.agent.parsers import hermes
from hybridflow.agent.parsers.base import TOOL_PARSERS, ParsedTurn, ToolCall, ToolParser, get_tool_parser

__all__ = ["TOOL_PARSERS", "ParsedTurn", "ToolCall", "ToolParser", "get_tool_parser", "hermes"]
