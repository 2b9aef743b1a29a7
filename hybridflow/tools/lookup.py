"""``lookup(key)``: the code stored under a key in the trajectory's own table.

The tool of the built-in ``tool-lookup`` task (:mod:`hybridflow.data.tasks.tool_lookup`). Each
trajectory gets its table through the row's ``tools_kwargs``::

    {"lookup": {"create_kwargs": {"entries": [{"key": "amber", "code": "48213"}, ...]}}}

(a list of pairs rather than a mapping, so tables with different keys share one parquet type).
A key that is not in the table answers ``no code is stored under 'x'`` — a normal answer the
model can recover from, not an error.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from hybridflow.data.tasks.tool_lookup import LOOKUP_TOOL_SCHEMA
from hybridflow.tools.base import BaseTool, ToolOutput


class LookupTool(BaseTool):
    """Per-trajectory key → code tables; see the module docstring."""

    def __init__(self, config: Mapping[str, Any] | None = None, tool_schema: Mapping[str, Any] | None = None) -> None:
        super().__init__(config, tool_schema)
        self._tables: dict[str, dict[str, str]] = {}

    def default_schema(self) -> dict[str, Any]:
        return LOOKUP_TOOL_SCHEMA

    async def create(self, instance_id: str, entries: Sequence[Mapping[str, Any]] = (), **kwargs: Any) -> None:
        if kwargs:
            raise ValueError(f"unexpected create_kwargs {sorted(kwargs)}; the lookup tool takes 'entries'")
        table = {}
        for i, entry in enumerate(entries):
            if not isinstance(entry, Mapping) or "key" not in entry or "code" not in entry:
                raise ValueError(f"entries[{i}] must be a mapping with 'key' and 'code', got {entry!r:.80}")
            table[str(entry["key"])] = str(entry["code"])
        self._tables[instance_id] = table

    async def execute(self, instance_id: str, parameters: dict[str, Any]) -> ToolOutput:
        if "key" not in parameters:
            raise ValueError("missing required argument: key")
        key = str(parameters["key"]).strip()
        table = self._tables.get(instance_id, {})
        if key in table:
            return table[key], 0.0, {"found": 1.0}
        return f"no code is stored under {key!r}", 0.0, {"found": 0.0}

    async def release(self, instance_id: str) -> None:
        self._tables.pop(instance_id, None)
