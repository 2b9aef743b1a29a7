"""The RL row schema (verl's), and validation that names the file, row and field at fault.

A row as stored::

    {"data_source": "openai/gsm8k",
     "prompt": [{"role": "user", "content": "..."}],          # the chat messages
     "ability": "math",                                         # optional
     "reward_model": {"style": "rule", "ground_truth": "72"},
     "extra_info": {"split": "train", "index": 0, ...}}         # optional

:func:`validate_rl_row` turns a stored row into an :class:`RLRow` or raises
:class:`DataRowError` ("train.parquet: row 17: field 'prompt': ...").
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from hybridflow import fields as F
from hybridflow.utils.errors import InputError

PROMPT_KEY = "prompt"
ABILITY = "ability"
GROUND_TRUTH = "ground_truth"
REWARD_STYLES: tuple[str, ...] = ("rule", "model")


class DataRowError(InputError, ValueError):
    """A malformed row: the message names the file, the 0-based row index and the field."""

    def __init__(self, file: str, row_index: int, field: str, problem: str) -> None:
        super().__init__(f"{file}: row {row_index}: field {field!r}: {problem}")
        self.file = file
        self.row_index = row_index
        self.field = field
        self.problem = problem


@dataclass(frozen=True)
class RLRow:
    """One validated RL prompt. ``index`` is ``extra_info["index"]`` if given, else the row number."""

    data_source: str
    messages: list[dict[str, Any]]
    ability: str | None
    reward_model: dict[str, Any]
    extra_info: dict[str, Any]
    index: int
    agent_name: str | None = None  # the agent loop that runs this row (verl's agent_name column)


AGENT_NAME = "agent_name"


def validate_rl_row(row: dict[str, Any], *, file: str, row_index: int, prompt_key: str = PROMPT_KEY) -> RLRow:
    """Check one stored row against the schema above and return it normalised."""

    def fail(field: str, problem: str) -> DataRowError:
        return DataRowError(file, row_index, field, problem)

    for required in (F.DATA_SOURCE, prompt_key, F.REWARD_MODEL):
        if required not in row:
            raise fail(required, f"missing column (row has: {', '.join(sorted(row)) or 'nothing'})")
    data_source = row[F.DATA_SOURCE]
    if not isinstance(data_source, str) or not data_source:
        raise fail(F.DATA_SOURCE, f"expected a non-empty string, got {data_source!r}")
    messages = _validate_messages(row[prompt_key], lambda problem: fail(prompt_key, problem))
    reward_model = _validate_reward_model(row[F.REWARD_MODEL], lambda problem: fail(F.REWARD_MODEL, problem))
    extra_info = row[F.EXTRA_INFO] if F.EXTRA_INFO in row else None
    if extra_info is None:
        extra_info = {}
    if not isinstance(extra_info, dict):
        raise fail(F.EXTRA_INFO, f"expected a dict, got {type(extra_info).__name__}")
    ability = row[ABILITY] if ABILITY in row else None
    if ability is not None and not isinstance(ability, str):
        raise fail(ABILITY, f"expected a string, got {type(ability).__name__}")
    index = extra_info["index"] if extra_info.get("index") is not None else row_index
    if isinstance(index, bool) or not isinstance(index, int):
        raise fail(f"{F.EXTRA_INFO}.index", f"expected an integer, got {index!r}")
    agent_name = row.get(AGENT_NAME) if hasattr(row, "get") else None
    if agent_name is not None and (not isinstance(agent_name, str) or not agent_name):
        raise fail(AGENT_NAME, f"expected the name of an agent loop (a non-empty string), got {agent_name!r}")
    return RLRow(data_source, messages, ability, reward_model, dict(extra_info), index, agent_name)


def _validate_messages(value: Any, fail) -> list[dict[str, Any]]:
    if isinstance(value, str):
        raise fail(
            "expected a list of {role, content} chat messages, got a plain string "
            "(plain-string prompts are read with data.apply_chat_template=false)"
        )
    if not isinstance(value, (list, tuple)):
        raise fail(f"expected a list of {{role, content}} chat messages, got {type(value).__name__}")
    if not value:
        raise fail("empty prompt (no messages)")
    messages = check_message_dicts(value, fail)
    if not any(m["content"].strip() for m in messages):
        raise fail("empty prompt (every message's content is blank)")
    return messages


def check_message_dicts(value: Sequence[Any], fail: Callable[[str], Exception]) -> list[dict[str, Any]]:
    """Each item of ``value`` checked as a ``{role, content, ...}`` chat message (a non-empty string
    role, a string content) and copied without its None-valued keys; ``fail(problem)`` builds the
    error raised for the first bad one. Shared by the RL schema and the SFT / pair datasets."""
    messages = []
    for j, message in enumerate(value):
        if not isinstance(message, dict):
            raise fail(f"message {j}: expected a dict with role and content, got {type(message).__name__}")
        role, content = message.get("role"), message.get("content")
        if not isinstance(role, str) or not role:
            raise fail(f"message {j}: 'role' must be a non-empty string, got {role!r}")
        if not isinstance(content, str):
            raise fail(f"message {j}: 'content' must be a string, got {type(content).__name__}")
        # parquet struct columns fill absent keys with None; templates expect them absent
        messages.append({k: v for k, v in message.items() if v is not None})
    return messages


def _validate_reward_model(value: Any, fail) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise fail(f"expected a dict with 'style' and 'ground_truth', got {type(value).__name__}")
    style = value.get("style")
    if style is not None and style not in REWARD_STYLES:
        raise fail(f"'style' must be one of {REWARD_STYLES}, got {style!r}")
    if GROUND_TRUTH not in value:
        raise fail("missing key 'ground_truth'")
    if style != "model" and value[GROUND_TRUTH] is None:
        raise fail("'ground_truth' is null (only style 'model' rows may omit it)")
    return dict(value)
