"""``@function_tool`` schemas from type hints and docstrings; schema checks; running a function tool."""

from __future__ import annotations

import asyncio
import enum
from typing import Any, Literal

import pytest

from hybridflow.tools.base import FunctionTool, check_tool_schema, function_tool, parse_docstring


class Unit(enum.Enum):
    CM = "cm"
    INCH = "inch"


@function_tool
def convert(value: float, unit: Unit, digits: int = 2, exact: bool = False) -> str:
    """Convert a length between units.

    Uses the international inch.

    Args:
        value: the length to convert,
            any real number.
        unit: the unit of ``value``.
        digits (int): digits after the point.
        exact: keep every digit.

    Returns:
        the converted length.
    """
    factor = 2.54 if unit is Unit.INCH or unit == "inch" else 1 / 2.54
    return f"{round(value * factor, digits)}"


def test_schema_from_hints_and_a_google_docstring():
    assert convert.schema == {
        "type": "function",
        "function": {
            "name": "convert",
            "description": "Convert a length between units.\n\nUses the international inch.",
            "parameters": {
                "type": "object",
                "properties": {
                    "value": {"type": "number", "description": "the length to convert, any real number."},
                    "unit": {"type": "string", "enum": ["cm", "inch"], "description": "the unit of ``value``."},
                    "digits": {"type": "integer", "description": "digits after the point."},
                    "exact": {"type": "boolean", "description": "keep every digit."},
                },
                "required": ["value", "unit"],
            },
        },
    }
    assert convert.name == "convert"
    assert convert(1.0, Unit.INCH) == "2.54"  # still callable like the function


def test_container_optional_and_literal_hints_with_a_sphinx_docstring():
    @function_tool(name="search", description="Find documents.")
    def find(query: str, tags: list[str], limit: int | None = None, mode: Literal["fast", "exact"] = "fast",
             filters: dict[str, int] | None = None, extra: Any = None) -> list[str]:
        """Ignored summary.

        :param query: words to look for
        :param tags: tags that must
            all match
        :returns: the matching documents
        """
        return [query]

    fn = find.schema["function"]
    assert fn["name"] == "search" and fn["description"] == "Find documents."
    props = fn["parameters"]["properties"]
    assert props["query"] == {"type": "string", "description": "words to look for"}
    assert props["tags"] == {"type": "array", "items": {"type": "string"}, "description": "tags that must all match"}
    assert props["limit"] == {"type": "integer"}
    assert props["mode"] == {"type": "string", "enum": ["fast", "exact"]}
    assert props["filters"] == {"type": "object", "additionalProperties": {"type": "integer"}}
    assert props["extra"] == {}
    assert fn["parameters"]["required"] == ["query", "tags"]


def test_docstring_sections_are_not_part_of_the_description():
    description, params = parse_docstring("Add two numbers.\n\nArgs:\n    a: first\n    b: second\n\nRaises:\n    ValueError: never")
    assert description == "Add two numbers."
    assert params == {"a": "first", "b": "second"}


@pytest.mark.parametrize(
    ("source", "message"),
    [
        (lambda: function_tool(lambda x: x), "parameter 'x' has no type hint"),
        (lambda: function_tool(_varargs), r"\*args / \*\*kwargs"),
        (lambda: function_tool(_positional_only), "positional-only"),
        (lambda: function_tool(_object_hint), "no JSON schema for type hint"),
    ],
)
def test_functions_a_model_cannot_call_are_refused(source, message):
    with pytest.raises(TypeError, match=message):
        source()


def _varargs(*items: int) -> int:
    return len(items)


def _positional_only(a: int, /) -> int:
    return a


def _object_hint(a: object) -> str:
    return str(a)


def test_execute_checks_arguments_and_runs_sync_and_async_functions():
    @function_tool
    def add(a: int, b: int) -> int:
        """Add."""
        return a + b

    @function_tool
    async def greet(name: str) -> dict[str, str]:
        """Greet."""
        await asyncio.sleep(0)
        return {"hello": name}

    assert isinstance(add, FunctionTool)
    assert asyncio.run(add.execute("t1", {"a": 2, "b": 3})) == ("5", 0.0, {})
    assert asyncio.run(greet.execute("t1", {"name": "Ana"})) == ('{"hello": "Ana"}', 0.0, {})
    with pytest.raises(ValueError, match="unknown argument"):
        asyncio.run(add.execute("t1", {"a": 1, "b": 2, "c": 3}))
    with pytest.raises(ValueError, match="missing required argument"):
        asyncio.run(add.execute("t1", {"a": 1}))


@pytest.mark.parametrize(
    ("schema", "message"),
    [
        ({"type": "tool", "function": {"name": "a"}}, "type must be 'function'"),
        ({"type": "function"}, "needs a 'function' mapping"),
        ({"type": "function", "function": {"name": "has space"}}, "tool name must be"),
        ({"type": "function", "function": {"name": "a", "parameters": {"type": "array"}}}, "type 'object'"),
        (
            {"type": "function", "function": {"name": "a", "parameters": {"type": "object", "properties": {}, "required": ["x"]}}},
            "required parameter",
        ),
    ],
)
def test_bad_schemas_are_refused(schema, message):
    with pytest.raises(ValueError, match=message):
        check_tool_schema(schema)


def test_a_minimal_schema_gets_defaults():
    schema = check_tool_schema({"type": "function", "function": {"name": "ping"}})
    assert schema["function"] == {
        "name": "ping", "description": "", "parameters": {"type": "object", "properties": {}, "required": []}
    }
