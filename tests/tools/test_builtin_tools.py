"""The calculator (ast, never eval) and the Python tool (separate process, timeout, memory cap)."""

from __future__ import annotations

import asyncio

import pytest

from hybridflow.tools.calculator import CalculatorTool, evaluate, format_number
from hybridflow.tools.python import PythonTool


@pytest.mark.parametrize(
    ("expression", "value"),
    [
        ("12*7", 84),
        ("(2 + 3) * 4 - 6 / 3", 18.0),
        ("2^10", 1024),
        ("-3 ** 2", -9),
        ("7 // 2 + 7 % 2", 4),
        ("sqrt(16) + abs(-2) + max(1, 5) + round(2.6)", 14.0),
        ("123 × 45", 5535),
    ],
)
def test_arithmetic(expression, value):
    assert evaluate(expression) == value


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ("__import__('os').system('true')", "unknown function \"__import__"),
        ("exit()", "unknown function 'exit'"),
        ("x + 1", "unknown name 'x'"),
        ("(1).real", "Attribute is not allowed"),
        ("'a' * 3", "only numbers are allowed"),
        ("9 ** 9 ** 9", "larger than 1000"),
        ("10 ** 999 * 10 ** 999 * 10", "more than 1000 digits"),
        ("2 ** 0.5 ** -2000", "larger than 1000"),
        ("1e308 * 10", "not finite"),
        ("(-8) ** 0.5", "not a real number"),
        ("1 +", "not an arithmetic expression"),
        ("", "empty"),
        ("1" * 501, "longer than 500"),
        ("[1, 2]", "List is not allowed"),
        ("True + 1", "only numbers"),
    ],
)
def test_anything_but_arithmetic_is_refused(expression, message):
    with pytest.raises(ValueError, match=message):
        evaluate(expression)


def test_number_formatting():
    assert [format_number(v) for v in (84, 18.0, 0.1 + 0.2, 2.5e20)] == ["84", "18", "0.3", "2.5e+20"]


def test_calculator_tool():
    tool = CalculatorTool()
    assert tool.name == "calculator" and tool.schema["function"]["parameters"]["required"] == ["expression"]
    assert asyncio.run(tool.execute("t", {"expression": "3*(4+5)"})) == ("27", 0.0, {})


def test_python_runs_in_the_sandbox_and_reports_failures():
    tool = PythonTool(config={"timeout_s": 20, "allow_weak_isolation": True})

    async def both():
        return await asyncio.gather(
            tool.execute("t", {"code": "import os\nprint(6 * 7)\nprint(os.getcwd().startswith('/'))"}),
            tool.execute("t", {"code": "print('before')\nraise ValueError('bad input')"}),
        )

    (ok_text, _, ok_metrics), (bad_text, _, bad_metrics) = asyncio.run(both())
    assert ok_text == "42\nTrue\n" and ok_metrics == {"exit_code": 0, "status": "Finished"}
    assert bad_text.startswith("before\nTraceback") and "ValueError: bad input" in bad_text
    assert bad_text.endswith("[exit code 1]") and bad_metrics == {"exit_code": 1, "status": "Finished"}


def test_python_tool_timeout_memory_and_output_caps():
    def tool(**config):
        return PythonTool(config={"allow_weak_isolation": True, "timeout_s": 20, **config})

    async def three():
        return await asyncio.gather(
            tool(timeout_s=1.0).execute("t", {"code": "print('start', flush=True)\nwhile True: pass"}),
            tool(memory_limit_mb=256).execute("t", {"code": "b = bytearray(2 * 1024**3)\nprint('allocated')"}),
            tool(max_output_bytes=1000).execute("t", {"code": "print('x' * 100000)"}),
        )

    (slow, _, slow_m), (memory, _, memory_m), (output, _, output_m) = asyncio.run(three())
    assert slow == "start\n\n[stopped: did not finish within 1 s]" and slow_m["status"] == "TimeLimitExceeded"
    assert "MemoryError" in memory and "allocated" not in memory and memory_m == {"exit_code": 1, "status": "Finished"}
    assert output == "x" * 1000 + "\n[stopped: stdout passed 1000 bytes]" and output_m["status"] == "OutputLimitExceeded"


def test_python_tool_refuses_unknown_config_keys():
    with pytest.raises(ValueError, match=r"unknown config key\(s\) \['timeout'\]"):
        PythonTool(config={"timeout": 3, "allow_weak_isolation": True})
