"""verl tool classes run unchanged (issue 30, part 5): detection, the adapter's lifecycle,
responses and rewards, and verl's example tool YAMLs loading."""

from __future__ import annotations

import asyncio
import textwrap

import pytest

from hybridflow.sandbox.executor import FINISHED, TIME_LIMIT, RunResult
from hybridflow.tools.calculator import CalculatorTool
from hybridflow.tools.calls import FatalToolError, ToolSession
from hybridflow.tools.gsm8k import Gsm8kAnswerTool
from hybridflow.tools.registry import ToolConfigError, load_tool_config
from hybridflow.tools.sandbox_fusion import SandboxFusionTool
from hybridflow.tools.verl_adapter import (
    OpenAIFunctionToolSchema,
    ToolResponse,
    VerlToolAdapter,
    is_verl_tool_class,
    verl_shape_problems,
)

CHECK_SCHEMA = """
    tool_schema:
      type: function
      function:
        name: check_answer
        description: Check an answer.
        parameters:
          type: object
          properties:
            answer: {type: string, description: the answer}
          required: [answer]
"""


def run(coro):
    return asyncio.run(coro)


def write(tmp_path, text: str):
    path = tmp_path / "tools.yaml"
    path.write_text(textwrap.dedent(text))
    return path


def tool_yaml(class_path: str, config: str = "{type: native}") -> str:
    return f"tools:\n  - class_name: {class_path}\n    config: {config}" + CHECK_SCHEMA


def load_one(tmp_path, text: str):
    tools = load_tool_config(write(tmp_path, text))
    assert len(tools) == 1
    return tools[0]


class PlainClass:
    def execute(self, instance_id, parameters):
        return "x"


def test_detection_is_by_shape(verl_tools):
    assert is_verl_tool_class(verl_tools.AnswerCheckTool)
    assert is_verl_tool_class(verl_tools.NoRewardTool)  # inherits create/release from verl's BaseTool
    assert not is_verl_tool_class(CalculatorTool)  # a hybridflow tool runs as it is
    assert verl_shape_problems(PlainClass) == [
        "create is not an async method",
        "execute is not an async method",
        "release is not an async method",
    ]


def test_a_class_of_neither_kind_is_refused_naming_what_is_missing(tmp_path, monkeypatch):
    (tmp_path / "plain_mod_for_test.py").write_text(
        "class Plain:\n    async def execute(self, a, b, c):\n        pass\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ToolConfigError) as err:
        load_tool_config(write(tmp_path, tool_yaml("plain_mod_for_test.Plain")))
    assert str(err.value) == (
        f"{tmp_path / 'tools.yaml'}: tools[0]: plain_mod_for_test.Plain is neither a subclass of "
        "hybridflow.tools.base.BaseTool nor a verl-style tool class (create is not an async method; release is "
        "not an async method; execute does not take (instance_id, parameters))"
    )


def test_lifecycle_create_execute_release_through_the_session(verl_tools, tmp_path):
    verl_tools.EVENTS.clear()
    tool = load_one(tmp_path, tool_yaml(f"{verl_tools.__name__}.AnswerCheckTool", "{type: native, bonus: 0.5}"))
    assert isinstance(tool, VerlToolAdapter) and tool.name == "check_answer"
    assert tool.tool.config == {"type": "native", "bonus": 0.5}
    assert isinstance(tool.tool.tool_schema, OpenAIFunctionToolSchema)
    assert tool.tool.tool_schema.function.parameters.properties["answer"].description == "the answer"

    async def trajectory():
        session = ToolSession(
            {tool.name: tool}, {"check_answer": {"create_kwargs": {"ground_truth": "84"}}}, trajectory_id="t1"
        )
        wrong = await session.call("check_answer", {"answer": "83"})
        right = await session.call("check_answer", '{"answer": "84"}')
        await session.release()
        return wrong, right

    wrong, right = run(trajectory())
    assert (wrong.text, wrong.reward, wrong.metrics, wrong.error) == ("checked 83: 0.0", 0.0, {"checked": 1}, False)
    assert (right.text, right.reward, right.error) == ("checked 84: 0.5", 0.5, False)
    own = "own-0-t1:check_answer"
    assert verl_tools.EVENTS == [
        ("create", "t1:check_answer", own, {"ground_truth": "84"}),  # create_kwargs as verl's agent loop passes them
        ("execute", own, 0.0),
        ("execute", own, 0.5),
        ("release", own),
    ]
    assert tool._ids == {}


def test_no_reward_is_not_an_error_and_images_stop_the_run(verl_tools, tmp_path):
    def yaml_for(cls: str) -> str:
        return tool_yaml(f"{verl_tools.__name__}.{cls}")

    quiet = load_one(tmp_path, yaml_for("NoRewardTool"))
    result = run(ToolSession({quiet.name: quiet}, trajectory_id="t").call("check_answer", {"answer": "1"}))
    assert (result.text, result.reward, result.metrics, result.error) == ("ran", None, {}, False)
    images = load_one(tmp_path, yaml_for("ImageTool"))
    with pytest.raises(FatalToolError) as err:
        run(ToolSession({images.name: images}, trajectory_id="t").call("check_answer", {"answer": "1"}))
    assert str(err.value) == (
        f"tool 'check_answer' ({verl_tools.__name__}.ImageTool) returned a ToolResponse with image content; "
        "multi-modal tool responses are not supported by hybridflow yet: return text only"
    )


def test_schema_from_the_class_when_the_yaml_has_none(verl_tools, tmp_path):
    tool = load_one(
        tmp_path, f"tools:\n  - class_name: {verl_tools.__name__}.SchemaInCodeTool\n    config: {{type: native}}\n"
    )
    assert tool.schema == {
        "type": "function",
        "function": {
            "name": "echo",
            "description": "Echo text.",
            "strict": False,
            "parameters": {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]},
        },
    }
    assert run(ToolSession({"echo": tool}, trajectory_id="t").call("echo", {"text": "hi"})).text == "hi"


def test_tool_response_checks_its_lists():
    assert ToolResponse(text="a").is_text_only() and ToolResponse().is_empty()
    with pytest.raises(ValueError, match="ToolResponse.image must be a list"):
        ToolResponse(image="one")


# verl's example tool files (examples/sglang_multiturn/config/tool_config/*.yaml): their key
# structure, with values of our own.
GSM8K_TOOL_CONFIG = """
tools:
  - class_name: "verl.tools.gsm8k_tool.Gsm8kTool"
    config:
      type: native
    tool_schema:
      type: "function"
      function:
        name: "calc_gsm8k_reward"
        description: "Score a GSM8K answer."
        parameters:
          type: "object"
          properties:
            answer:
              type: "string"
              description: "the final number"
          required: ["answer"]
"""

SANDBOX_FUSION_TOOL_CONFIG = """
tools:
  - class_name: "verl.tools.sandbox_fusion_tools.SandboxFusionTool"
    config:
      sandbox_fusion_url: "http://127.0.0.1:9/run_code"
      num_workers: 6
      enable_global_rate_limit: true
      rate_limit: 3
      default_timeout: 7
      default_language: "python"
      memory_limit_mb: 256
      type: native
    tool_schema:
      type: "function"
      function:
        name: "code_interpreter"
        description: "Run code."
        parameters:
          type: "object"
          properties:
            code:
              type: "string"
              description: "the code"
          required: ["code"]
"""

SEARCH_TOOL_CONFIG = """
tools:
  - class_name: verl.tools.search_tool.SearchTool
    config:
      retrieval_service_url: http://127.0.0.1:9/retrieve
      num_workers: 4
      rate_limit: 4
      timeout: 5
      type: native
    tool_schema:
      type: function
      function:
        name: search
        description: Search.
        parameters:
          type: object
          properties:
            query_list:
              type: array
              item:
                type: string
              description: queries
          required:
            - query_list
"""


def test_verl_gsm8k_tool_config_loads_as_the_builtin_and_scores_as_verl(tmp_path):
    tool = load_one(tmp_path, GSM8K_TOOL_CONFIG)
    assert isinstance(tool, Gsm8kAnswerTool) and tool.name == "calc_gsm8k_reward"

    async def calls():
        await tool.create("i", ground_truth="72")
        out = [await tool.execute("i", {"answer": a}) for a in ("71", "72", "72", "#### 72")]
        await tool.release("i")
        return out

    assert run(calls()) == [
        ("Current parsed answer='71' reward=0.0", -0.05, {}),  # no improvement over 0.0
        ("Current parsed answer='72' reward=1.0", 0.0, {}),
        ("Current parsed answer='72' reward=1.0", -0.05, {}),  # resubmitting the same score
        ("Current parsed answer='#### 72' reward=1.0", -0.05, {}),
    ]


def test_verl_sandbox_fusion_tool_config_loads_with_verls_keys(tmp_path, monkeypatch):
    tool = load_one(tmp_path, SANDBOX_FUSION_TOOL_CONFIG)
    assert isinstance(tool, SandboxFusionTool) and tool.name == "code_interpreter"
    sandbox = tool.sandbox
    assert (sandbox.endpoint, sandbox._slots.size, sandbox.memory_mb, sandbox.timeout_s) == (
        "http://127.0.0.1:9/run_code",
        3,
        256,
        7.0,
    )
    runs = []

    async def fake_run(code, *, stdin="", timeout_s=None, memory_mb=None):
        runs.append((code, timeout_s))
        status = FINISHED if "ok" in code else TIME_LIMIT
        return RunResult(status, 0, "out\n", "err\n", 0.1, "remote")

    monkeypatch.setattr(sandbox, "run", fake_run)
    assert run(tool.execute("i", {"code": "print('ok')"})) == ("out\nerr\n", None, {})
    assert run(tool.execute("i", {"code": "loop", "timeout": 2})) == ("no stdout here", None, {})
    assert runs == [("print('ok')", 7.0), ("loop", 2.0)]
    with pytest.raises(ToolConfigError, match="needs config.sandbox_fusion_url"):
        load_one(tmp_path, SANDBOX_FUSION_TOOL_CONFIG.replace('"http://127.0.0.1:9/run_code"', '""'))


def test_verl_search_tool_config_is_refused_saying_what_to_do(tmp_path):
    with pytest.raises(ToolConfigError) as err:
        load_tool_config(write(tmp_path, SEARCH_TOOL_CONFIG))
    assert str(err.value) == (
        f"{tmp_path / 'tools.yaml'}: tools[0]: verl.tools.search_tool.SearchTool (a client of a retrieval server) "
        "is verl's tool class and verl is not installed; hybridflow has no built-in equivalent. Install verl to "
        "run verl's class through the adapter, or name your own tool class (hybridflow BaseTool or verl-style) "
        "in class_name"
    )
