"""verl's tool classes, run by hybridflow's tool loop without changes.

A verl tool has another interface than :class:`hybridflow.tools.base.BaseTool`: its
``create(instance_id=None, **kwargs)`` returns ``(instance_id, ToolResponse)``, its
``execute(instance_id, parameters, **kwargs)`` returns ``(ToolResponse, reward | None, metrics)``,
it receives its schema as an object with attributes (``tool_schema.function.name``), and it
has ``calc_reward(instance_id)``. :class:`VerlToolAdapter` wraps such a class so the loop
drives it like a native tool.

**Detection is by shape, not by name** (:func:`is_verl_tool_class`): a class that is not a
hybridflow ``BaseTool`` and whose ``create``, ``execute`` and ``release`` are coroutine
functions, with an ``execute`` that takes ``(instance_id, parameters)``. That holds for any
subclass of verl's ``BaseTool`` (its methods are all ``async def``), whether verl is installed
or the class uses the stand-ins below, and needs no import of verl.

The stand-ins :class:`ToolResponse`, :class:`OpenAIFunctionToolSchema` and
:class:`VerlBaseTool` let a verl tool module run where verl is not installed: change its
imports to this module, nothing else. No ``verl`` package is faked, so an installed verl is
never shadowed and ``import verl`` still fails where verl is absent.
"""

from __future__ import annotations

import inspect
import logging
import sys
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any
from uuid import uuid4

from hybridflow.tools.base import BaseTool, ToolOutput
from hybridflow.tools.calls import FatalToolError

logger = logging.getLogger(__name__)

_REQUIRED_ASYNC = ("create", "execute", "release")


class ToolResponse:
    """verl's tool answer: ``text`` and the multi-modal lists ``image`` and ``video``."""

    def __init__(self, text: str | None = None, image: list[Any] | None = None, video: list[Any] | None = None) -> None:
        for key, value in (("image", image), ("video", video)):
            if value is not None and not isinstance(value, list):
                raise ValueError(
                    f"ToolResponse.{key} must be a list (wrap one item as [item]), got {type(value).__name__}"
                )
        self.text, self.image, self.video = text, image, video

    def is_empty(self) -> bool:
        return not self.text and not self.image and not self.video

    def is_text_only(self) -> bool:
        return bool(self.text) and not self.image and not self.video

    def model_dump(self, **_: Any) -> dict[str, Any]:
        return {"text": self.text, "image": self.image, "video": self.video}

    def __repr__(self) -> str:
        return f"ToolResponse(text={self.text!r}, image={self.image!r}, video={self.video!r})"


@dataclass
class OpenAIFunctionPropertySchema:
    """One parameter of a function schema (verl's fields: type, description, enum)."""

    type: str
    description: str | None = None
    enum: list[Any] | None = None


@dataclass
class OpenAIFunctionParametersSchema:
    type: str = "object"
    properties: dict[str, OpenAIFunctionPropertySchema] = field(default_factory=dict)
    required: list[str] = field(default_factory=list)


@dataclass
class OpenAIFunctionSchema:
    name: str
    description: str = ""
    parameters: OpenAIFunctionParametersSchema = field(default_factory=OpenAIFunctionParametersSchema)
    strict: bool = False


@dataclass
class OpenAIFunctionToolSchema:
    """A tool schema with attribute access, as verl tools read it (``schema.function.name``);
    ``model_validate`` / ``model_dump`` as on verl's pydantic model."""

    type: str
    function: OpenAIFunctionSchema

    @classmethod
    def model_validate(cls, data: Mapping[str, Any]) -> OpenAIFunctionToolSchema:
        fn = dict(data["function"])
        params = dict(fn.get("parameters") or {})
        properties = {
            name: OpenAIFunctionPropertySchema(
                type=str(prop.get("type", "")), description=prop.get("description"), enum=prop.get("enum")
            )
            for name, prop in (params.get("properties") or {}).items()
        }
        parameters = OpenAIFunctionParametersSchema(
            type=params.get("type", "object"), properties=properties, required=list(params.get("required") or [])
        )
        function = OpenAIFunctionSchema(
            name=fn["name"],
            description=fn.get("description", ""),
            parameters=parameters,
            strict=bool(fn.get("strict", False)),
        )
        return cls(type=str(data["type"]), function=function)

    def model_dump(self, *, exclude_none: bool = False, **_: Any) -> dict[str, Any]:
        return _drop_none(asdict(self)) if exclude_none else asdict(self)


def _drop_none(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _drop_none(v) for k, v in value.items() if v is not None}
    return value


class VerlBaseTool:
    """verl's ``BaseTool`` interface with its defaults, for tool modules where verl is absent."""

    def __init__(self, config: dict[str, Any], tool_schema: OpenAIFunctionToolSchema | None) -> None:
        self.config = config
        self.tool_schema = tool_schema or self.get_openai_tool_schema()
        if self.tool_schema is None:
            raise ValueError(f"{type(self).__name__}: no tool schema (give tool_schema in the tool config)")
        self.name = self.tool_schema.function.name

    def get_openai_tool_schema(self) -> OpenAIFunctionToolSchema | None:
        return getattr(self, "tool_schema", None)

    async def create(self, instance_id: str | None = None, **kwargs: Any) -> tuple[str, ToolResponse]:
        return (instance_id if instance_id is not None else str(uuid4())), ToolResponse()

    async def execute(
        self, instance_id: str, parameters: dict[str, Any], **kwargs: Any
    ) -> tuple[ToolResponse, float | None, dict[str, Any]]:
        return ToolResponse(text="Updated the tool state."), 0.0, {}

    async def calc_reward(self, instance_id: str, **kwargs: Any) -> float:
        return 0.0

    async def release(self, instance_id: str, **kwargs: Any) -> None:
        return None


def verl_shape_problems(cls: type) -> list[str]:
    """What keeps ``cls`` from being a verl-style tool class (empty: it is one)."""
    problems = [f"{name} is not an async method" for name in _REQUIRED_ASYNC if not _is_async(cls, name)]
    execute = getattr(cls, "execute", None)
    if callable(execute):
        try:
            inspect.signature(execute).bind(None, "instance", {})
        except (TypeError, ValueError):
            problems.append("execute does not take (instance_id, parameters)")
    return problems


def is_verl_tool_class(cls: type) -> bool:
    """Whether ``cls`` has verl's tool interface (see the module docstring for the rule)."""
    return isinstance(cls, type) and not issubclass(cls, BaseTool) and not verl_shape_problems(cls)


def _is_async(cls: type, name: str) -> bool:
    return inspect.iscoroutinefunction(getattr(cls, name, None))


def schema_object(schema: Mapping[str, Any]) -> Any:
    """The schema as the object a verl tool expects: verl's own pydantic model when the tool's
    module imported ``verl.tools.schemas`` (a real verl, whose ``BaseTool`` calls pydantic
    methods on it), else this module's stand-in."""
    module = sys.modules.get("verl.tools.schemas")
    model = getattr(module, "OpenAIFunctionToolSchema", None) if module is not None else None
    return (model or OpenAIFunctionToolSchema).model_validate(dict(schema))


def schema_dict(schema: Any, where: str) -> dict[str, Any]:
    """A schema object (pydantic model, stand-in or mapping) as a plain dict."""
    if isinstance(schema, Mapping):
        return dict(schema)
    dump = getattr(schema, "model_dump", None)
    if callable(dump):
        return dict(dump(exclude_none=True))
    raise ValueError(f"{where}: get_openai_tool_schema() returned {type(schema).__name__}, not a schema")


def response_text(response: Any, where: str) -> str:
    """The text of a verl ``ToolResponse`` (or a plain string, as older verl tools returned).

    Images and videos are refused with :class:`FatalToolError`, which stops the run: the
    model would otherwise train on tool turns that silently lost their content.
    """
    if response is None:
        return ""
    if isinstance(response, str):
        return response
    for key in ("image", "video"):
        if getattr(response, key, None):
            raise FatalToolError(
                f"{where} returned a ToolResponse with {key} content; multi-modal tool responses are not "
                "supported by hybridflow yet: return text only"
            )
    if not hasattr(response, "text"):
        raise TypeError(f"{where} returned {type(response).__name__}, not a ToolResponse")
    return "" if response.text is None else str(response.text)


class VerlToolAdapter(BaseTool):
    """A verl-style tool class driven through hybridflow's :class:`BaseTool` interface.

    ``create`` passes the row's ``create_kwargs`` both as keyword arguments (verl's tools take
    ``ground_truth=...``) and as ``create_kwargs=`` (what verl's agent loop passes), and keeps
    the instance id the tool returns. ``execute`` returns the response's text, the tool's
    reward (``None`` stays ``None``: no step reward, as in verl) and its metrics.
    """

    def __init__(self, cls: type, config: Mapping[str, Any], tool_schema: Mapping[str, Any] | None) -> None:
        where = f"{cls.__module__}.{cls.__qualname__}"
        self.tool = cls(config=dict(config), tool_schema=schema_object(tool_schema) if tool_schema else None)
        schema = tool_schema if tool_schema else schema_dict(self.tool.get_openai_tool_schema(), where)
        super().__init__(config, schema)
        self.where = f"tool {self.name!r} ({where})"
        self._ids: dict[str, str] = {}

    async def create(self, instance_id: str, **kwargs: Any) -> None:
        extra = {} if "create_kwargs" in kwargs else {"create_kwargs": dict(kwargs)}
        created = await self.tool.create(instance_id, **kwargs, **extra)
        if isinstance(created, str):  # older verl tools returned the id alone
            created = (created, None)
        if not isinstance(created, tuple) or len(created) != 2:
            raise TypeError(f"{self.where}: create returned {type(created).__name__}, not (instance_id, ToolResponse)")
        self._ids[instance_id] = str(created[0])

    async def execute(self, instance_id: str, parameters: dict[str, Any]) -> ToolOutput:
        out = await self.tool.execute(self._ids.get(instance_id, instance_id), parameters)
        if not isinstance(out, tuple) or len(out) != 3:
            raise TypeError(f"{self.where}: execute returned {type(out).__name__}, not (ToolResponse, reward, metrics)")
        response, reward, metrics = out
        return response_text(response, self.where), reward, dict(metrics or {})

    async def calc_reward(self, instance_id: str, **kwargs: Any) -> Any:
        """The tool's ``calc_reward`` for this instance (the loop does not call it; see docs/agent.md)."""
        return await self.tool.calc_reward(self._ids.get(instance_id, instance_id), **kwargs)

    async def release(self, instance_id: str) -> None:
        await self.tool.release(self._ids.pop(instance_id, instance_id))

    def __repr__(self) -> str:
        return f"VerlToolAdapter({self.where})"
