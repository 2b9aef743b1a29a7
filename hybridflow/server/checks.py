"""Per-request checks the request schemas cannot express: configurable caps, and text that the
tokenizer or chat template would choke on.

:class:`ServerLimits` holds the caps (``hybridflow serve --max-n ...``); :func:`check_text`
walks every string of a request body. Both raise :class:`BadRequest`, which the app turns into
a 400 naming the parameter.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

# How deeply a request body may nest objects and lists. Real requests stay far below (a tool's
# JSON schema nests a few levels); the chat template's helpers and jinja walk nested values
# recursively, so a body nested hundreds deep used to end in a RecursionError and a 500 with a
# traceback thousands of lines long.
MAX_JSON_DEPTH = 64


class BadRequest(ValueError):
    """A request the server understands but cannot serve (unknown model, too long, ...)."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class OverBudget(Exception):
    """A request asks for more generated tokens than one request may (answered with 429)."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


def json_depth(value: Any, stop_at: int | None = None) -> int:
    """How deeply ``value`` nests dicts and lists (a scalar is 0, ``{}`` and ``[1]`` are 1).

    Walks with an explicit stack, so any depth is measured without recursion; with ``stop_at``
    the walk ends as soon as that depth is passed."""
    deepest = 0
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, (list, tuple)):
            children = item
        else:
            continue
        deepest = max(deepest, depth)
        if stop_at is not None and deepest > stop_at:
            return deepest
        stack.extend((child, depth + 1) for child in children)
    return deepest


def check_depth(value: Any, limit: int = MAX_JSON_DEPTH) -> None:
    """Raise ``ValueError`` when ``value`` nests deeper than ``limit`` levels."""
    if json_depth(value, stop_at=limit) > limit:
        raise ValueError(
            f"the request nests objects or lists more than {limit} levels deep; this server takes at most {limit}"
        )


@dataclass(frozen=True)
class ServerLimits:
    """Caps on one request, so that no single client can occupy the server.

    ``max_n``: responses per prompt; ``max_prompts``: prompts in one call (a completion's
    ``prompt`` list, ``/generate``'s ``input_ids`` list); ``max_stop``: stop strings or extra
    stop token ids; ``max_stop_chars``: characters in one stop string; ``max_prompt_tokens``:
    tokens in one prompt after tokenization (``None``: the model's context is the only cap);
    ``max_body_bytes``: size of a request body, checked before it is parsed;
    ``max_request_tokens``: tokens one request may ask to generate, prompts × ``n`` ×
    ``max_tokens`` (above it: 429, :class:`OverBudget`).
    """

    max_n: int = 16
    max_prompts: int = 64
    max_stop: int = 16
    max_stop_chars: int = 256
    max_prompt_tokens: int | None = None
    max_body_bytes: int = 8 * 1024 * 1024
    max_request_tokens: int = 65536

    def __post_init__(self) -> None:
        for name in ("max_n", "max_prompts", "max_stop", "max_stop_chars", "max_body_bytes", "max_request_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.max_prompt_tokens is not None and self.max_prompt_tokens < 1:
            raise ValueError(f"max_prompt_tokens must be >= 1, got {self.max_prompt_tokens}")

    def check_n(self, n: int, param: str = "n") -> None:
        if n > self.max_n:
            raise BadRequest(f"{param}={n} is above this server's limit of {self.max_n} responses per prompt", param)

    def check_prompts(self, count: int, param: str) -> None:
        if count > self.max_prompts:
            raise BadRequest(f"{count} prompts in one request; this server takes at most {self.max_prompts}", param)

    def check_stops(self, stops: list[str] | list[int], param: str) -> None:
        if len(stops) > self.max_stop:
            what = "stop token ids" if param.endswith("stop_token_ids") else "stop strings"
            raise BadRequest(f"{len(stops)} {what} given; this server takes at most {self.max_stop}", param)
        for stop in stops:
            if isinstance(stop, str) and len(stop) > self.max_stop_chars:
                raise BadRequest(f"a stop string of {len(stop)} characters; the limit is {self.max_stop_chars}", param)

    def check_prompt_tokens(self, count: int, param: str) -> None:
        if self.max_prompt_tokens is not None and count > self.max_prompt_tokens:
            raise BadRequest(
                f"prompt is {count} tokens; this server takes prompts of at most {self.max_prompt_tokens} tokens",
                param,
            )

    def check_request_tokens(self, max_new_tokens: list[int], n: int, param: str) -> None:
        """``max_new_tokens``: the limit of each prompt of the request; each runs ``n`` times."""
        total = n * sum(max_new_tokens)
        if total > self.max_request_tokens:
            raise OverBudget(
                f"this request asks for up to {total} generated tokens ({len(max_new_tokens)} prompt(s) x n={n} x "
                f"{param}); this server takes at most {self.max_request_tokens} per request: send fewer prompts, "
                f"a smaller n or a smaller {param}, or split it into several requests",
                param,
            )


def _strings(value: Any, path: str) -> Iterator[tuple[str, str]]:
    """Every string in a JSON-like value (keys included), with its dotted path."""
    if isinstance(value, str):
        yield path, value
    elif isinstance(value, dict):
        for key, item in value.items():
            sub = f"{path}.{key}" if path else str(key)
            if isinstance(key, str):
                yield sub + " (key)", key
            yield from _strings(item, sub)
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            yield from _strings(item, f"{path}.{i}" if path else str(i))


def _problem(text: str) -> str | None:
    if "\x00" in text:
        return "contains a NUL character (U+0000)"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        code = ord(text[err.start])
        return f"contains a lone UTF-16 surrogate (U+{code:04X}) that is not valid Unicode text"
    return None


def check_text(body: dict[str, Any]) -> None:
    """Raise :class:`BadRequest` for the first string that holds a NUL or a lone surrogate.

    JSON allows both (``"\\u0000"``, ``"\\ud800"``); the tokenizer rejects the surrogate with
    an internal type error and a chat template may pass a NUL on silently, so both stop here
    with a message that names the field.
    """
    for path, text in _strings(body, ""):
        problem = _problem(text)
        if problem is not None:
            field = path.removesuffix(" (key)")
            raise BadRequest(f"{path} {problem}", field or None)
