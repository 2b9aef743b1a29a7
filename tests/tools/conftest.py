"""Fixtures for verl-style tools: ``verl`` imports that resolve, and a tool module using them.

``verl_imports`` makes ``from verl.tools.base_tool import BaseTool`` work: with a real verl
installed it changes nothing (the real package is used, never shadowed); without one it puts
the test-only stand-in (tests/tools/verl_stub) on ``sys.path`` and removes it and every
``verl`` module it loaded afterwards, so no other test sees a fake ``verl``.
"""

from __future__ import annotations

import importlib.util
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

STUB_ROOT = Path(__file__).parent / "verl_stub"
TOOL_MODULE = "my_verl_style_tools"

# A tool module as a verl user writes it: verl's imports and interface, nothing from hybridflow.
VERL_STYLE_TOOLS = '''
from typing import Any, Optional

from verl.tools.base_tool import BaseTool
from verl.tools.schemas import OpenAIFunctionToolSchema, ToolResponse

EVENTS: list[tuple] = []


class AnswerCheckTool(BaseTool):
    """Scores a submitted answer against the row's ground truth (verl's gsm8k-tool pattern:
    execute calls calc_reward and returns it as the step reward)."""

    def __init__(self, config: dict, tool_schema: OpenAIFunctionToolSchema):
        super().__init__(config, tool_schema)
        self._instance_dict: dict[str, dict[str, Any]] = {}
        self.bonus = config.get("bonus", 1.0)

    async def create(
        self, instance_id: Optional[str] = None, ground_truth: Optional[str] = None, **kwargs
    ) -> tuple[str, ToolResponse]:
        own_id = f"own-{len(EVENTS)}-{instance_id}"  # the tool picks its own id, as verl tools may
        if ground_truth is None:
            ground_truth = kwargs.get("create_kwargs", {}).get("ground_truth", self.config.get("expected"))
        self._instance_dict[own_id] = {"ground_truth": ground_truth, "answer": None}
        EVENTS.append(("create", instance_id, own_id, kwargs.get("create_kwargs")))
        return own_id, ToolResponse()

    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs) -> tuple[ToolResponse, float, dict]:
        self._instance_dict[instance_id]["answer"] = str(parameters.get("answer", ""))
        reward = await self.calc_reward(instance_id)
        EVENTS.append(("execute", instance_id, reward))
        return ToolResponse(text=f"checked {parameters.get('answer')}: {reward}"), reward, {"checked": 1}

    async def calc_reward(self, instance_id: str, **kwargs) -> float:
        state = self._instance_dict[instance_id]
        return self.bonus if state["answer"] == state["ground_truth"] else 0.0

    async def release(self, instance_id: str, **kwargs) -> None:
        EVENTS.append(("release", instance_id))
        del self._instance_dict[instance_id]


class NoRewardTool(BaseTool):
    """Like verl's sandbox tool: text, no step reward (None), no metrics (None)."""

    async def execute(self, instance_id, parameters, **kwargs):
        return ToolResponse(text="ran"), None, None


class ImageTool(BaseTool):
    async def execute(self, instance_id, parameters, **kwargs):
        return ToolResponse(text="look", image=["<an image>"]), 0.0, {}


class SchemaInCodeTool(BaseTool):
    """No tool_schema in the YAML: the class supplies it, as verl tools may."""

    def __init__(self, config: dict, tool_schema: OpenAIFunctionToolSchema):
        super().__init__(config, tool_schema)

    def get_openai_tool_schema(self) -> OpenAIFunctionToolSchema:
        return OpenAIFunctionToolSchema.model_validate(
            {"type": "function", "function": {"name": "echo", "description": "Echo text.",
             "parameters": {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}}}
        )

    async def execute(self, instance_id, parameters, **kwargs):
        return ToolResponse(text=parameters["text"]), 0.0, {}
'''


def _drop_modules(prefixes: tuple[str, ...]) -> None:
    for name in [n for n in sys.modules if n.split(".")[0] in prefixes]:
        del sys.modules[name]


@pytest.fixture
def verl_imports(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """``verl.tools.base_tool`` / ``verl.tools.schemas`` importable (see the module docstring)."""
    if importlib.util.find_spec("verl") is not None:
        yield
        return
    monkeypatch.syspath_prepend(str(STUB_ROOT))
    try:
        yield
    finally:
        _drop_modules(("verl", TOOL_MODULE))


@pytest.fixture
def verl_tools(verl_imports: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    """The verl-style tool module above, importable as ``my_verl_style_tools``."""
    (tmp_path / f"{TOOL_MODULE}.py").write_text(textwrap.dedent(VERL_STYLE_TOOLS))
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module(TOOL_MODULE)
    yield module
    _drop_modules((TOOL_MODULE,))
