"""One trajectory's tool calls: truncation sides, error texts, instances."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from hybridflow.tools.base import BaseTool, function_tool
from hybridflow.tools.calculator import CalculatorTool
from hybridflow.tools.calls import ToolSession, truncate_tool_text

TEXT = "0123456789abcdefghij"


@pytest.mark.parametrize(
    ("side", "expected"),
    [
        ("left", "012345...(truncated)"),
        ("right", "(truncated)...efghij"),
        ("middle", "012...(truncated)...hij"),
    ],
)
def test_truncation_sides_name_what_is_kept(side, expected):
    assert truncate_tool_text(TEXT, 6, side) == expected
    assert truncate_tool_text(TEXT, 20, side) == TEXT


def test_middle_truncation_keeps_exactly_the_limit_when_odd():
    assert truncate_tool_text(TEXT, 5, "middle") == "012...(truncated)...ij"


def test_bad_truncation_settings_are_refused():
    with pytest.raises(ValueError, match="tool_response_truncate_side"):
        truncate_tool_text(TEXT, 5, "top")
    with pytest.raises(ValueError, match="max_tool_response_length"):
        truncate_tool_text(TEXT, 0, "left")


class Flaky(BaseTool):
    def __init__(self, fail_create: bool = False) -> None:
        super().__init__()
        self.fail_create = fail_create

    def default_schema(self) -> dict[str, Any]:
        return {"type": "function", "function": {"name": "flaky", "description": "misbehaves"}}

    async def create(self, instance_id, **kwargs):
        if self.fail_create:
            raise ConnectionError("no backend")

    async def execute(self, instance_id, parameters):
        if parameters.get("mode") == "raise":
            raise KeyError("k")
        if parameters.get("mode") == "hang":
            await asyncio.Event().wait()
        if parameters.get("mode") == "shape":
            return "just text"
        return 12345, "0.25", None


def session(*tools: BaseTool, **kwargs) -> ToolSession:
    return ToolSession({t.name: t for t in tools}, trajectory_id="traj", **kwargs)


def run(coro):
    return asyncio.run(coro)


@pytest.mark.parametrize(
    ("name", "arguments", "expected"),
    [
        ("nope", {}, "Error: unknown tool 'nope'; available tools: calculator, flaky"),
        ("calculator", "{bad", "Error: the arguments of 'calculator' are not valid JSON (Expecting property name enclosed in double quotes "
         "at character 1); pass a JSON object such as {\"x\": 1}"),
        ("calculator", "[1]", "Error: the arguments of 'calculator' are a JSON list, not an object; pass a JSON object such as {\"x\": 1}"),
        ("calculator", {"expression": "1/0"}, "Error: tool 'calculator' failed: ZeroDivisionError: division by zero"),
        ("flaky", {"mode": "raise"}, "Error: tool 'flaky' failed: KeyError: 'k'"),
        ("flaky", {"mode": "hang"}, "Error: tool 'flaky' did not finish within 0.05 s"),
        ("flaky", {"mode": "shape"}, "Error: tool 'flaky' returned str, not (text, reward, metrics)"),
    ],
)
def test_every_failure_is_a_message_for_the_model(name, arguments, expected):
    result = run(session(CalculatorTool(), Flaky(), timeout_s=0.05).call(name, arguments))
    assert result.text == expected
    assert result.error and result.reward is None


def test_a_failing_create_is_a_message_and_values_are_coerced():
    assert run(session(Flaky(fail_create=True)).call("flaky", {})).text == (
        "Error: tool 'flaky' could not start: ConnectionError: no backend"
    )
    result = run(session(Flaky()).call("flaky", '{"mode": "ok"}'))
    assert (result.text, result.reward, result.metrics, result.error) == ("12345", 0.25, {}, False)


def test_empty_argument_text_means_no_arguments():
    @function_tool
    def ping() -> str:
        """Ping."""
        return "pong"

    assert run(session(ping).call("ping", "")).text == "pong"


def test_instances_are_created_once_per_tool_even_for_concurrent_calls_and_released():
    log: list[tuple[str, Any]] = []

    class Counter(BaseTool):
        def default_schema(self):
            return {"type": "function", "function": {"name": "counter"}}

        async def create(self, instance_id, **kwargs):
            log.append(("create", instance_id, kwargs))
            await asyncio.sleep(0)

        async def execute(self, instance_id, parameters):
            log.append(("execute", instance_id))
            return "ok", 0.0, {}

        async def release(self, instance_id):
            log.append(("release", instance_id))

    async def scenario():
        s = ToolSession({"counter": Counter()}, '{"counter": {"create_kwargs": {"start": 5}}}', trajectory_id="t7")
        await asyncio.gather(s.call("counter", {}), s.call("counter", {}))
        await s.release()
        await s.release()  # idempotent

    run(scenario())
    assert log[0] == ("create", "t7:counter", {"start": 5})
    assert [e[0] for e in log] == ["create", "execute", "execute", "release"]


def test_output_is_truncated_with_the_session_settings():
    @function_tool
    def shout() -> str:
        """Loud."""
        return "x" * 100

    result = run(session(shout, max_tool_response_length=4, tool_response_truncate_side="right").call("shout", {}))
    assert result.text == "(truncated)...xxxx"
