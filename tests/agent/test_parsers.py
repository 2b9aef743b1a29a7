"""The hermes tool-call parser: several calls, unreadable blocks, reasoning spans, the registry."""

from __future__ import annotations

import json

import pytest

from hybridflow.agent.parsers import TOOL_PARSERS, ToolCall, get_tool_parser
from hybridflow.agent.parsers.hermes import strip_thinking

hermes = get_tool_parser("hermes")


def test_several_calls_in_order_with_the_text_around_them():
    text = (
        'First <tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call> then '
        '<tool_call>{"name": "lookup", "arguments": {"key": "x"}}</tool_call> done.<|im_end|>'
    )
    turn = hermes.parse(text)
    assert turn.calls == [ToolCall("add", {"a": 1, "b": 2}), ToolCall("lookup", {"key": "x"})]
    assert turn.errors == []
    assert turn.content == "First  then  done.<|im_end|>"


def test_malformed_blocks_are_skipped_and_counted():
    text = (
        "<tool_call>{not json}</tool_call>"
        '<tool_call>["a list"]</tool_call>'
        '<tool_call>{"arguments": {}}</tool_call>'
        '<tool_call>{"name": "ok", "arguments": {"v": 1}}</tool_call>'
    )
    turn = hermes.parse(text)
    assert turn.calls == [ToolCall("ok", {"v": 1})]
    assert len(turn.errors) == 3
    assert turn.errors[0].startswith("not valid JSON")
    assert turn.errors[1].startswith("a JSON list")
    assert turn.errors[2].startswith("no tool name")


def test_an_unclosed_call_is_an_error_not_a_call():
    turn = hermes.parse('Let me check. <tool_call>{"name": "add", "arguments": {"a": 1')
    assert turn.calls == [] and turn.errors == ["a <tool_call> was not closed with </tool_call>"]
    assert turn.content == "Let me check."


def test_arguments_kept_as_written_when_a_string_and_empty_when_missing():
    turn = hermes.parse(
        '<tool_call>{"name": "a", "arguments": "{\\"x\\": 1}"}</tool_call>'
        '<tool_call>{"name": "b"}</tool_call>'
        '<tool_call>{"name": "c", "arguments": [1, 2]}</tool_call>'
    )
    assert turn.calls == [ToolCall("a", '{"x": 1}'), ToolCall("b", {}), ToolCall("c", "[1, 2]")]


@pytest.mark.parametrize(
    "text",
    [
        '<think>I could <tool_call>{"name": "a", "arguments": {}}</tool_call></think>No call.',
        'still reasoning <tool_call>{"name": "a", "arguments": {}}</tool_call></think>No call.',  # <think> was in the prompt
        'Answer. <think>maybe <tool_call>{"name": "a", "arguments": {}}</tool_call>',  # unclosed at the end
    ],
)
def test_calls_inside_thinking_are_ignored(text):
    turn = hermes.parse(text)
    assert turn.calls == [] and turn.errors == []


def test_a_call_after_thinking_is_found():
    text = '<think>use the tool</think><tool_call>{"name": "a", "arguments": {"k": 2}}</tool_call>'
    assert hermes.parse(text).calls == [ToolCall("a", {"k": 2})]
    assert strip_thinking(text) == '<tool_call>{"name": "a", "arguments": {"k": 2}}</tool_call>'


def test_format_instructions_list_the_schemas_and_the_format():
    schema = {"type": "function", "function": {"name": "calculator", "description": "math", "parameters": {}}}
    text = hermes.format_instructions([schema])
    assert json.dumps(schema) in text
    assert "<tool_call>" in text and "</tool_call>" in text
    assert hermes.parse(text).calls == []  # the example in the instructions is not valid JSON


def test_unknown_format_lists_the_known_ones():
    assert "hermes" in TOOL_PARSERS
    with pytest.raises(ValueError, match="unknown tool parser 'xml'; valid names: hermes"):
        get_tool_parser("xml")
