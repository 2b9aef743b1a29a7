"""Which tools a run has: verl's tool YAML (``multi_turn.tool_config_path``) and
``@function_tool`` files (``function_tool_path``), merged into one name → tool table.

verl's tool file::

    tools:
      - class_name: hybridflow.tools.calculator.CalculatorTool
        config:
          type: native            # the only type here; verl's "mcp" is refused
        tool_schema:              # optional when the class has a default schema
          type: function
          function:
            name: calculator
            description: ...
            parameters: {type: object, properties: {...}, required: [...]}

Each entry builds ``cls(config=<config mapping>, tool_schema=<schema or None>)``. A class
with verl's tool interface is wrapped in :class:`~hybridflow.tools.verl_adapter.VerlToolAdapter`.
verl's own tool classes (``verl.tools.gsm8k_tool.Gsm8kTool``, ...) are used when verl is
installed; otherwise the ones with a built-in equivalent map onto it (:data:`VERL_BUILTINS`)
and the others are a start-up error saying what to do. A function tool file is a Python file
whose module-level ``@function_tool`` functions become tools. Everything wrong here is a
start-up error that names the file and the entry: a missing class, a class that is neither
kind of tool, a bad schema, two tools with one name.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml

from hybridflow.tools.base import BaseTool, FunctionTool
from hybridflow.tools.verl_adapter import VerlToolAdapter, verl_shape_problems
from hybridflow.utils.errors import InputError
from hybridflow.utils.user_code import import_user_file

logger = logging.getLogger(__name__)

FUNCTION_TOOL_MODULE_PREFIX = "hybridflow_function_tools"

VERL_BUILTINS: dict[str, str] = {
    "verl.tools.gsm8k_tool.Gsm8kTool": "hybridflow.tools.gsm8k.Gsm8kAnswerTool",
    "verl.tools.sandbox_fusion_tools.SandboxFusionTool": "hybridflow.tools.sandbox_fusion.SandboxFusionTool",
}
"""verl's tool classes → the built-in used when verl is not installed."""

VERL_WITHOUT_EQUIVALENT: dict[str, str] = {
    "verl.tools.search_tool.SearchTool": "a client of a retrieval server",
    "verl.tools.geo3k_tool.Geo3kTool": "the geometry3k answer-scoring tool",
    "verl.tools.image_zoom_in_tool.ImageZoomInTool": "an image tool (multi-modal tools are not supported)",
    "verl.tools.mcp_search_tool.MCPSearchTool": "an MCP tool (config.type 'mcp' is not supported)",
}
"""verl's tool classes with no built-in equivalent: what each is, for the error message."""


class ToolConfigError(InputError, ValueError):
    """A tool configuration that cannot be used; the message names the file and entry."""


def import_class(dotted: str, where: str) -> type:
    """The class at ``package.module.Class``; :class:`ToolConfigError` naming ``where`` otherwise."""
    module_name, _, attr = dotted.rpartition(".")
    if not module_name:
        raise ToolConfigError(f"{where}: {dotted!r} is not a dotted class path like 'package.module.Class'")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        raise ToolConfigError(f"{where}: cannot import module {module_name!r} ({type(exc).__name__}: {exc})") from exc
    if not hasattr(module, attr):
        raise ToolConfigError(f"{where}: module {module_name!r} has no attribute {attr!r}")
    obj = getattr(module, attr)
    if not isinstance(obj, type):
        raise ToolConfigError(f"{where}: {dotted!r} is a {type(obj).__name__}, not a class")
    return obj


def _read_yaml(path: str | os.PathLike[str], what: str) -> Any:
    file = Path(path).expanduser()
    if not file.is_file():
        raise FileNotFoundError(f"{what}: no such file {file}")
    try:
        return yaml.safe_load(file.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise ToolConfigError(f"{what}: {file} is not valid YAML: {exc}") from exc


def load_tool_config(path: str | os.PathLike[str]) -> list[BaseTool]:
    """The tools declared in a verl tool YAML file, in file order."""
    data = _read_yaml(path, "multi_turn.tool_config_path")
    if not isinstance(data, Mapping) or not isinstance(data.get("tools"), list):
        raise ToolConfigError(f"{path}: a tool config is a mapping with a 'tools' list")
    tools: list[BaseTool] = []
    for i, entry in enumerate(data["tools"]):
        where = f"{path}: tools[{i}]"
        if not isinstance(entry, Mapping):
            raise ToolConfigError(f"{where} must be a mapping with class_name, config and tool_schema")
        unknown = sorted(set(entry) - {"class_name", "config", "tool_schema"})
        if unknown:
            raise ToolConfigError(
                f"{where}: unknown key(s) {', '.join(unknown)}; expected class_name, config, tool_schema"
            )
        class_name = entry.get("class_name")
        if not isinstance(class_name, str) or not class_name:
            raise ToolConfigError(f"{where}: class_name is missing")
        config = entry.get("config") or {}
        if not isinstance(config, Mapping):
            raise ToolConfigError(f"{where}: config must be a mapping")
        kind = config.get("type", "native")
        if kind != "native":
            raise ToolConfigError(f"{where}: config.type {kind!r} is not supported; only 'native' tools run here")
        tools.append(build_tool(class_name, dict(config), entry.get("tool_schema"), where))
    return tools


def build_tool(class_name: str, config: dict[str, Any], schema: Any, where: str) -> BaseTool:
    """One tool from a YAML entry: a hybridflow tool as it is, a verl-style one wrapped."""
    cls = resolve_tool_class(class_name, where)
    native = issubclass(cls, BaseTool)
    problems = [] if native else verl_shape_problems(cls)
    if problems:
        raise ToolConfigError(
            f"{where}: {class_name} is neither a subclass of hybridflow.tools.base.BaseTool nor a "
            f"verl-style tool class ({'; '.join(problems)})"
        )
    try:
        return cls(config=config, tool_schema=schema) if native else VerlToolAdapter(cls, config, schema)
    except (ValueError, TypeError, KeyError, AssertionError) as exc:  # verl's tools check their config with assert
        raise ToolConfigError(f"{where} ({class_name}): {exc}") from exc


def resolve_tool_class(class_name: str, where: str) -> type:
    """The class a YAML ``class_name`` names; verl's built-in tools map as :data:`VERL_BUILTINS`
    says when verl is not importable, so verl's example files load unchanged."""
    if (class_name in VERL_BUILTINS or class_name in VERL_WITHOUT_EQUIVALENT) and _module_missing(class_name):
        if class_name in VERL_WITHOUT_EQUIVALENT:
            raise ToolConfigError(
                f"{where}: {class_name} ({VERL_WITHOUT_EQUIVALENT[class_name]}) is verl's tool class and verl is "
                "not installed; hybridflow has no built-in equivalent. Install verl to run verl's class through "
                "the adapter, or name your own tool class (hybridflow BaseTool or verl-style) in class_name"
            )
        logger.info(
            "%s: verl is not installed; %s runs as hybridflow's %s", where, class_name, VERL_BUILTINS[class_name]
        )
        return import_class(VERL_BUILTINS[class_name], f"{where}.class_name")
    return import_class(class_name, f"{where}.class_name")


def _module_missing(class_name: str) -> bool:
    """Whether the module of ``class_name`` cannot be found (its package absent included)."""
    try:
        return importlib.util.find_spec(class_name.rpartition(".")[0]) is None
    except (ImportError, ValueError):
        return True


def load_function_tools(path: str | os.PathLike[str]) -> list[FunctionTool]:
    """The module-level ``@function_tool`` functions of a Python file, in definition order."""
    file = Path(path).expanduser()
    if not file.is_file():
        raise FileNotFoundError(f"function_tool_path: no such file {file}")
    try:
        module = import_user_file(file, FUNCTION_TOOL_MODULE_PREFIX, "function_tool_path", reuse=True)
    except ImportError as exc:
        raise ToolConfigError(str(exc)) from exc
    tools = [value for value in vars(module).values() if isinstance(value, FunctionTool)]
    if not tools:
        raise ToolConfigError(f"function_tool_path: {file} defines no @function_tool functions")
    return tools


def merge_tools(sources: Iterable[tuple[str, Iterable[BaseTool]]]) -> dict[str, BaseTool]:
    """One name → tool table from ``(origin, tools)`` pairs; two different tools with one
    name are an error naming both origins (the same object twice is fine)."""
    table: dict[str, BaseTool] = {}
    origins: dict[str, str] = {}
    for origin, tools in sources:
        for tool in tools:
            existing = table.get(tool.name)
            if existing is None:
                table[tool.name], origins[tool.name] = tool, origin
            elif existing is not tool:
                raise ToolConfigError(
                    f"two tools are named {tool.name!r}: {existing!r} from {origins[tool.name]} and {tool!r} "
                    f"from {origin}; rename one (tool_schema.function.name or @function_tool(name=...))"
                )
    return table


def build_tools(
    tool_config_path: str | os.PathLike[str] | None = None,
    function_tool_path: str | os.PathLike[str] | None = None,
    tools: Iterable[BaseTool] = (),
) -> dict[str, BaseTool]:
    """All tools of a run: the YAML file's, the function file's, then ``tools`` given in code."""
    sources: list[tuple[str, Iterable[BaseTool]]] = []
    if tool_config_path:
        sources.append((f"tool_config_path {tool_config_path}", load_tool_config(tool_config_path)))
    if function_tool_path:
        sources.append((f"function_tool_path {function_tool_path}", load_function_tools(function_tool_path)))
    sources.append(("tools given in code", list(tools)))
    return merge_tools(sources)
