"""verl's tool YAML, function-tool files, and name clashes."""

from __future__ import annotations

import asyncio
import textwrap

import pytest

from hybridflow.tools.calculator import CalculatorTool
from hybridflow.tools.python import PythonTool
from hybridflow.tools.registry import ToolConfigError, build_tools, load_function_tools, load_tool_config

VERL_STYLE = """
tools:
  - class_name: "hybridflow.tools.calculator.CalculatorTool"
    config:
      type: native
  - class_name: "hybridflow.tools.python.PythonTool"
    config:
      type: native
      timeout_s: 3
      memory_limit_mb: 256
      allow_weak_isolation: true
    tool_schema:
      type: "function"
      function:
        name: "code_interpreter"
        description: "A tool for executing code."
        parameters:
          type: "object"
          properties:
            code:
              type: "string"
              description: "The code to execute."
          required: ["code"]
"""

FUNCTIONS = '''
from hybridflow.tools.base import function_tool

CODES = {"alpha": "XK-1", "beta": "QZ-9"}


@function_tool
def lookup(key: str) -> str:
    """Look up the code stored under a key.

    Args:
        key: the key, e.g. alpha.
    """
    return CODES.get(key, "no such key")


@function_tool(name="calculator")
def my_calculator(expression: str) -> str:
    """Shadows the built-in name."""
    return "0"


def helper(x):  # not a tool
    return x
'''


def write(tmp_path, name: str, text: str):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def test_verl_tool_yaml_builds_tools_with_config_and_schema(tmp_path):
    tools = load_tool_config(write(tmp_path, "tools.yaml", VERL_STYLE))
    assert [type(t) for t in tools] == [CalculatorTool, PythonTool]
    assert [t.name for t in tools] == ["calculator", "code_interpreter"]
    assert tools[1].config == {"type": "native", "timeout_s": 3, "memory_limit_mb": 256, "allow_weak_isolation": True}
    assert tools[1].schema["function"]["parameters"]["required"] == ["code"]


def test_function_tool_file_and_clash_with_the_yaml(tmp_path):
    yaml_path = write(tmp_path, "tools.yaml", VERL_STYLE)
    fn_path = write(tmp_path, "my_tools.py", FUNCTIONS)
    assert [t.name for t in load_function_tools(fn_path)] == ["lookup", "calculator"]
    with pytest.raises(ToolConfigError, match="two tools are named 'calculator'") as info:
        build_tools(yaml_path, fn_path)
    assert "tool_config_path" in str(info.value) and "function_tool_path" in str(info.value)


def test_build_tools_merges_sources(tmp_path):
    fn_path = write(tmp_path, "lookups.py", FUNCTIONS.split("@function_tool(name=")[0])
    calculator = CalculatorTool()
    tools = build_tools(function_tool_path=fn_path, tools=[calculator, calculator])  # the same object twice is fine
    assert sorted(tools) == ["calculator", "lookup"]
    assert asyncio.run(tools["lookup"].execute("t", {"key": "beta"})) == ("QZ-9", 0.0, {})


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("tools:\n  - class_name: hybridflow.tools.calculator.NoSuchTool\n", "has no attribute 'NoSuchTool'"),
        ("tools:\n  - class_name: no_such_pkg_xyz.Tool\n", "cannot import module 'no_such_pkg_xyz'"),
        ("tools:\n  - class_name: hybridflow.tools.calls.ToolSession\n", "neither a subclass of hybridflow.tools.base.BaseTool nor a verl-style tool class"),
        ("tools:\n  - class_name: hybridflow.tools.base.BaseTool\n", "Can't instantiate abstract class BaseTool"),
        ("tools:\n  - class_name: hybridflow.tools.calculator.CalculatorTool\n    config: {type: mcp}\n", "only 'native'"),
        ("tools:\n  - class_name: hybridflow.tools.calculator.CalculatorTool\n    schema: {}\n", "unknown key"),
        (
            "tools:\n  - class_name: hybridflow.tools.calculator.CalculatorTool\n"
            "    tool_schema: {type: function, function: {name: 'bad name'}}\n",
            "tool name must be",
        ),
        ("tools:\n  - config: {type: native}\n", "class_name is missing"),
        ("- just a list\n", "a 'tools' list"),
        ("tools: [\n", "not valid YAML"),
    ],
)
def test_bad_tool_configs_fail_at_start_up_naming_the_entry(tmp_path, text, message):
    path = write(tmp_path, "tools.yaml", text)
    with pytest.raises(ToolConfigError, match=message) as info:
        load_tool_config(path)
    assert str(path) in str(info.value)


def test_a_function_file_without_tools_or_that_fails_to_import(tmp_path):
    with pytest.raises(ToolConfigError, match="defines no @function_tool functions"):
        load_function_tools(write(tmp_path, "empty_tools.py", "X = 1\n"))
    with pytest.raises(ToolConfigError, match="importing .* failed: ZeroDivisionError"):
        load_function_tools(write(tmp_path, "broken_tools.py", "1 / 0\n"))
    with pytest.raises(FileNotFoundError, match="function_tool_path"):
        load_function_tools(tmp_path / "missing.py")
