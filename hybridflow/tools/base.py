"""Tools a model may call: the :class:`BaseTool` interface, OpenAI schemas, ``@function_tool``.

A tool is configured once (``config`` + an OpenAI function schema) and serves many
trajectories at the same time. State that belongs to one trajectory (a ground truth, a
scratch directory, a counter) lives in a per-trajectory *instance*: the loop calls
``create(instance_id, **create_kwargs)`` before the first call of a trajectory,
``execute(instance_id, parameters)`` for each call and ``release(instance_id)`` at the end.

``@function_tool`` turns a plain typed function into a tool: the schema (name, description,
parameter types, required parameters, per-parameter descriptions) is read from the signature
and the docstring, so the function is the single source of truth for what the model is told.
"""

from __future__ import annotations

import asyncio
import contextvars
import copy
import enum
import inspect
import json
import re
import threading
import types
import typing
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Literal, Union, overload

ToolOutput = tuple[str, float | None, dict[str, Any]]
"""What ``execute`` returns: the text shown to the model, a step reward (None: none, as verl's
``tool_rewards`` skips it), metrics."""

_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


def check_tool_schema(schema: Mapping[str, Any]) -> dict[str, Any]:
    """A validated deep copy of an OpenAI function-tool schema, with defaults filled in.

    The shape is ``{"type": "function", "function": {"name", "description", "parameters"}}``
    where ``parameters`` is a JSON schema of ``type: object``. Missing ``description`` becomes
    ``""`` and missing ``parameters`` an object without properties. Raises ``ValueError``
    naming the first problem, because a malformed schema is a start-up configuration error.
    """
    if not isinstance(schema, Mapping):
        raise ValueError(f"a tool schema is a mapping, got {type(schema).__name__}")
    if schema.get("type") != "function":
        raise ValueError(f"tool schema type must be 'function', got {schema.get('type')!r}")
    function = schema.get("function")
    if not isinstance(function, Mapping):
        raise ValueError("tool schema needs a 'function' mapping with name, description and parameters")
    name = function.get("name")
    if not isinstance(name, str) or not _NAME.match(name):
        raise ValueError(f"tool name must be 1-64 characters of letters, digits, '_' or '-', got {name!r}")
    out = copy.deepcopy(dict(schema))
    fn = out["function"] = dict(out["function"])
    description = fn.setdefault("description", "")
    if not isinstance(description, str):
        raise ValueError(f"tool {name!r}: description must be a string, got {type(description).__name__}")
    parameters = fn.setdefault("parameters", {"type": "object", "properties": {}, "required": []})
    if not isinstance(parameters, Mapping) or parameters.get("type") != "object":
        raise ValueError(f"tool {name!r}: parameters must be a JSON schema with type 'object'")
    properties = parameters.get("properties", {})
    if not isinstance(properties, Mapping):
        raise ValueError(f"tool {name!r}: parameters.properties must be a mapping")
    required = parameters.get("required", [])
    if not isinstance(required, Sequence) or isinstance(required, str):
        raise ValueError(f"tool {name!r}: parameters.required must be a list of names")
    missing = [r for r in required if r not in properties]
    if missing:
        raise ValueError(f"tool {name!r}: required parameter(s) {missing} are not among the properties")
    return out


def one_string_param_schema(name: str, description: str, param: str, param_description: str) -> dict[str, Any]:
    """The OpenAI function schema of a tool ``name(param)`` whose one, required parameter is a string."""
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {
                "type": "object",
                "properties": {param: {"type": "string", "description": param_description}},
                "required": [param],
            },
        },
    }


class BaseTool(ABC):
    """A callable capability with an OpenAI function schema and per-trajectory instances.

    Constructed as ``cls(config=..., tool_schema=...)`` (verl's tool YAML passes both). A
    subclass either receives its schema from the config file or supplies
    :meth:`default_schema`. ``execute`` may raise: the agent loop turns the exception into
    an error message the model reads, so tools do not need their own error formatting.
    """

    def __init__(self, config: Mapping[str, Any] | None = None, tool_schema: Mapping[str, Any] | None = None) -> None:
        self.config: dict[str, Any] = dict(config or {})
        schema = tool_schema if tool_schema is not None else self.default_schema()
        if schema is None:
            raise ValueError(
                f"{type(self).__name__} has no tool schema: give tool_schema in the tool config "
                "or override default_schema()"
            )
        self.schema: dict[str, Any] = check_tool_schema(schema)
        self.name: str = self.schema["function"]["name"]

    def default_schema(self) -> dict[str, Any] | None:
        """The schema used when the configuration gives none (None: a schema is required)."""
        return None

    async def create(self, instance_id: str, **kwargs: Any) -> None:
        """Set up the state of one trajectory (default: no state)."""

    @abstractmethod
    async def execute(self, instance_id: str, parameters: dict[str, Any]) -> ToolOutput:
        """Run one call; returns (text for the model, step reward, metrics)."""

    async def release(self, instance_id: str) -> None:
        """Drop the state of one trajectory (default: nothing to drop)."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r})"


# ---- @function_tool ----------------------------------------------------------------------------

_SECTION = re.compile(r"^\s*(Args|Arguments|Parameters|Params|Returns|Return|Raises|Yields|Examples?|Notes?)\s*:\s*$")
_ARG_LINE = re.compile(r"^\s*\*{0,2}(\w+)\s*(?:\(([^)]*)\))?\s*:\s*(.*)$")
_SPHINX_PARAM = re.compile(r"^\s*:param\s+(?:[\w\[\], |]+\s+)?(\w+)\s*:\s*(.*)$")


def parse_docstring(doc: str | None) -> tuple[str, dict[str, str]]:
    """(description, {parameter: description}) from a Google- or Sphinx-style docstring.

    The description is the text before the first section (``Args:``, ``Returns:``, ...) or
    ``:param`` line, paragraphs joined by a blank line. Continuation lines of a parameter are
    joined with spaces.
    """
    lines = inspect.cleandoc(doc or "").splitlines()
    summary: list[str] = []
    params: dict[str, str] = {}
    section: str | None = None
    current: str | None = None
    arg_indent: int | None = None  # indent of the parameter lines in the current Args section
    for line in lines:
        header = _SECTION.match(line)
        if header:
            section, current, arg_indent = header.group(1).lower(), None, None
            continue
        sphinx = _SPHINX_PARAM.match(line)
        if sphinx:
            section, current = "sphinx", sphinx.group(1)
            params[current] = sphinx.group(2).strip()
            continue
        if section is None:
            summary.append(line)
            continue
        if not line.strip() or section not in ("args", "arguments", "parameters", "params", "sphinx"):
            continue
        if section == "sphinx" and line.lstrip().startswith(":"):  # :returns:, :raises: ... end a parameter
            current = None
            continue
        indent = len(line) - len(line.lstrip())
        arg = _ARG_LINE.match(line) if section != "sphinx" else None
        if arg and (arg_indent is None or indent <= arg_indent):
            arg_indent, current = indent, arg.group(1)
            params[current] = arg.group(3).strip()
        elif current is not None:
            params[current] = f"{params[current]} {line.strip()}".strip()
    description = re.sub(r"\n{3,}", "\n\n", "\n".join(summary).strip())
    return description, params


def json_schema_for(annotation: Any, where: str) -> dict[str, Any]:
    """The JSON schema of a Python type hint (str, int, float, bool, list[...], dict, Literal,
    Enum, ``X | None``); ``TypeError`` naming ``where`` for anything else."""
    if annotation is Any:
        return {}
    if annotation is str:
        return {"type": "string"}
    if annotation is bool:
        return {"type": "boolean"}
    if annotation is int:
        return {"type": "integer"}
    if annotation is float:
        return {"type": "number"}
    if annotation is type(None):
        return {"type": "null"}
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        values = [member.value for member in annotation]
        return {**_literal_type(values, where), "enum": values}
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is Literal:
        return {**_literal_type(list(args), where), "enum": list(args)}
    if origin in (Union, types.UnionType):
        rest = [a for a in args if a is not type(None)]
        if len(rest) == 1:
            return json_schema_for(rest[0], where)
        return {"anyOf": [json_schema_for(a, where) for a in rest]}
    if annotation in (list, tuple, set) or origin in (list, set, Sequence, typing.Sequence):
        return {"type": "array", **({"items": json_schema_for(args[0], where)} if args else {})}
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return {"type": "array", "items": json_schema_for(args[0], where)}
        return {"type": "array", "prefixItems": [json_schema_for(a, where) for a in args]}
    if annotation is dict or origin in (dict, Mapping, typing.Mapping):
        schema: dict[str, Any] = {"type": "object"}
        if len(args) == 2 and args[1] is not Any:
            schema["additionalProperties"] = json_schema_for(args[1], where)
        return schema
    raise TypeError(f"{where}: no JSON schema for type hint {annotation!r}")


def _literal_type(values: list[Any], where: str) -> dict[str, Any]:
    kinds = {type(v) for v in values}
    for kind, name in ((str, "string"), (bool, "boolean"), (int, "integer"), (float, "number")):
        if kinds == {kind}:
            return {"type": name}
    raise TypeError(f"{where}: enum values must share one of str/int/float/bool, got {values!r}")


def schema_from_function(
    func: Callable[..., Any], name: str | None = None, description: str | None = None
) -> dict[str, Any]:
    """The OpenAI function-tool schema of ``func``, read from its type hints and docstring.

    Every parameter needs a type hint; parameters without a default are required; ``*args``
    and ``**kwargs`` are refused (a model cannot fill them meaningfully).
    """
    where = f"function tool {getattr(func, '__qualname__', func)!r}"
    doc_description, doc_params = parse_docstring(func.__doc__)
    try:
        hints = typing.get_type_hints(func)
    except Exception as exc:  # a forward reference that does not resolve
        raise TypeError(f"{where}: cannot resolve type hints ({exc})") from exc
    properties: dict[str, Any] = {}
    required: list[str] = []
    for param in inspect.signature(func).parameters.values():
        if param.kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD):
            raise TypeError(f"{where}: *args / **kwargs cannot be described to a model; name each parameter")
        if param.kind is inspect.Parameter.POSITIONAL_ONLY:
            raise TypeError(f"{where}: parameter {param.name!r} is positional-only; the model passes arguments by name")
        if param.name not in hints:
            raise TypeError(f"{where}: parameter {param.name!r} has no type hint")
        prop = json_schema_for(hints[param.name], f"{where}, parameter {param.name!r}")
        if param.name in doc_params and doc_params[param.name]:
            prop["description"] = doc_params[param.name]
        if param.default is inspect.Parameter.empty:
            required.append(param.name)
        properties[param.name] = prop
    return check_tool_schema(
        {
            "type": "function",
            "function": {
                "name": name or func.__name__,
                "description": description if description is not None else doc_description,
                "parameters": {"type": "object", "properties": properties, "required": required},
            },
        }
    )


class FunctionTool(BaseTool):
    """A tool backed by one function; made by :func:`function_tool`.

    The wrapper stays callable like the function. Sync functions run in a worker thread so a
    slow one does not stall other trajectories; coroutine functions are awaited. A return
    value that is not a string is shown to the model as JSON. Unknown or missing arguments
    raise ``ValueError`` before the function runs.
    """

    def __init__(self, func: Callable[..., Any], name: str | None = None, description: str | None = None) -> None:
        self.func = func
        super().__init__(config={}, tool_schema=schema_from_function(func, name, description))
        self.__doc__ = func.__doc__
        self.__wrapped__ = func

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.func(*args, **kwargs)

    async def execute(self, instance_id: str, parameters: dict[str, Any]) -> ToolOutput:
        parameters_schema = self.schema["function"]["parameters"]
        known = parameters_schema["properties"]
        unknown = sorted(set(parameters) - set(known))
        if unknown:
            raise ValueError(f"unknown argument(s) {', '.join(unknown)}; expected: {', '.join(known) or 'none'}")
        missing = [p for p in parameters_schema["required"] if p not in parameters]
        if missing:
            raise ValueError(f"missing required argument(s): {', '.join(missing)}")
        if inspect.iscoroutinefunction(self.func):
            result = await typing.cast(Awaitable[Any], self.func(**parameters))
        else:
            result = await run_in_daemon_thread(self.func, **parameters)
        text = result if isinstance(result, str) else json.dumps(result, ensure_ascii=False, default=str)
        return text, 0.0, {}


async def run_in_daemon_thread(func: Callable[..., Any], /, **kwargs: Any) -> Any:
    """``func(**kwargs)`` in a fresh daemon thread, awaited.

    Unlike ``asyncio.to_thread`` (the loop's default executor), a call that is abandoned (the
    per-call timeout fired) holds nothing: ``asyncio.run`` joins the default executor's threads
    when the loop ends, so one hung sync tool would hold the whole step until it returned.
    """
    loop = asyncio.get_running_loop()
    future: asyncio.Future[Any] = loop.create_future()
    context = contextvars.copy_context()

    def settle(ok: bool, value: Any) -> None:
        if not future.done():  # cancelled by the timeout: nobody is waiting any more
            (future.set_result if ok else future.set_exception)(value)

    def target() -> None:
        try:
            value, ok = context.run(func, **kwargs), True
        except Exception as exc:  # noqa: BLE001 - handed to the awaiting task
            value, ok = exc, False
        except BaseException as exc:  # noqa: BLE001 - sys.exit() in a tool is a failed call, not the step's end
            value, ok = RuntimeError(f"{type(exc).__name__}: {exc}"), False
        try:
            loop.call_soon_threadsafe(settle, ok, value)
        except RuntimeError:  # the loop is closed: the step ended without this call
            pass

    threading.Thread(target=target, name=f"hybridflow-tool-{getattr(func, '__name__', 'call')}", daemon=True).start()
    return await future


@overload
def function_tool(func: Callable[..., Any], /) -> FunctionTool: ...


@overload
def function_tool(
    *, name: str | None = None, description: str | None = None
) -> Callable[[Callable[..., Any]], FunctionTool]: ...


def function_tool(
    func: Callable[..., Any] | None = None, /, *, name: str | None = None, description: str | None = None
) -> FunctionTool | Callable[[Callable[..., Any]], FunctionTool]:
    """Decorator: ``@function_tool`` or ``@function_tool(name=..., description=...)``.

    The schema comes from the function: its name, the docstring's summary as description,
    each parameter's type hint as its JSON type and its ``Args:`` entry as its description.
    """
    if func is not None:
        return FunctionTool(func, name, description)

    def decorate(f: Callable[..., Any]) -> FunctionTool:
        return FunctionTool(f, name, description)

    return decorate
