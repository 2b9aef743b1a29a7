"""Token bookkeeping for multi-turn trajectories that never re-tokenizes the model's output.

A trajectory is one running list of token ids: the rendered prompt, then each assistant turn
exactly as the sampler produced it, then — between turns — only the tokens of the *new*
messages (tool results, user turns). Re-rendering the whole conversation as text and
tokenizing it again would change the model's own tokens (a different split of the same text,
a dropped reasoning span), so the ids trained on would not be the ids sampled.

New messages are rendered by difference against a fixed synthetic conversation:
``render(prefix + new, generation prompt) − render(prefix)``, where ``prefix`` is
``[system, user, assistant]`` with placeholder text. The difference is exactly what the
template puts after a finished assistant turn for those messages, ending with the next
generation prompt. The renderer checks that the prefix's tokens are unchanged when messages
follow it (a *prefix-stable* template); a template that is not fails loudly.

The separator rule: a template closes an assistant turn with an end-of-turn sequence that
the sampler does not complete. ChatML (SmolLM2, Qwen2) renders ``…<|im_end|>\\n`` while
generation stops at ``<|im_end|>``, so the ``\\n`` is missing from the running list. The
renderer reads the end-of-turn sequence off the template (the tokens after the assistant's
content in ``render(prefix)``) and, after each generated turn, inserts the part the model
did not produce — the separator after a stop token, or the whole sequence after a turn cut
short. Inserted tokens are context (response mask 0), like tool output.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from hybridflow.utils.errors import InputError

Message = Mapping[str, Any]

_SYSTEM = "You are a careful assistant."
_USER = "Please help with this task."
_ASSISTANT = "Here is my answer."
_PROBE_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "probe_tool",
        "description": "Checks whether the chat template renders tools.",
        "parameters": {"type": "object", "properties": {"x": {"type": "string"}}, "required": ["x"]},
    },
}


class TemplateError(InputError, ValueError):
    """A chat template the incremental renderer cannot use; the message says why."""


def render_ids(
    tokenizer: Any,
    messages: Sequence[Message],
    *,
    tools: Sequence[Mapping[str, Any]] | None = None,
    add_generation_prompt: bool,
    chat_template_kwargs: Mapping[str, Any] | None = None,
) -> list[int]:
    """Token ids of ``messages`` rendered with the tokenizer's chat template.

    Rendered to text, then encoded without added special tokens, as the RL dataset encodes
    prompts, so the ids of a single-turn prompt are the dataset's ids.
    """
    if not getattr(tokenizer, "chat_template", None):
        raise TemplateError("the tokenizer has no chat template; agent loops render chat messages with one")
    text = tokenizer.apply_chat_template(
        [dict(m) for m in messages],
        tools=[dict(t) for t in tools] if tools else None,
        add_generation_prompt=add_generation_prompt,
        tokenize=False,
        **dict(chat_template_kwargs or {}),
    )
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


@dataclass(frozen=True)
class TemplateFacts:
    """What the renderer learned from the template once.

    ``prefix_ids``: ``render([system, user, assistant])``; ``end_of_turn``: the tokens the
    template puts after an assistant's content (``<|im_end|>``, ``\\n`` for ChatML);
    ``uses_tools``: whether ``tools=`` changes the rendering at all.
    """

    prefix_ids: tuple[int, ...]
    end_of_turn: tuple[int, ...]
    uses_tools: bool


def _synthetic_prefix() -> list[dict[str, str]]:
    return [
        {"role": "system", "content": _SYSTEM},
        {"role": "user", "content": _USER},
        {"role": "assistant", "content": _ASSISTANT},
    ]


@lru_cache(maxsize=64)
def _facts(tokenizer: Any, template: str, tools_json: str, kwargs_json: str) -> TemplateFacts:
    del template  # part of the cache key only: a changed template must not reuse stale facts
    tools = json.loads(tools_json) or None
    kwargs = json.loads(kwargs_json)
    prefix = _synthetic_prefix()
    asked = render_ids(tokenizer, prefix[:2], tools=tools, add_generation_prompt=True, chat_template_kwargs=kwargs)
    answered = render_ids(tokenizer, prefix, tools=tools, add_generation_prompt=False, chat_template_kwargs=kwargs)
    if answered[: len(asked)] != asked:
        raise TemplateError(
            "the chat template renders an assistant turn differently from its own generation prompt "
            "(render(system, user) + generation prompt is not a prefix of render(system, user, assistant)); "
            "token-level multi-turn rendering needs the two to agree"
        )
    content = list(tokenizer(_ASSISTANT, add_special_tokens=False)["input_ids"])
    tail = answered[len(asked) :]
    if tail[: len(content)] != content:
        raise TemplateError(
            "the chat template changes an assistant message's text when rendering it (the rendered turn does "
            "not start with the message's own tokens); token-level multi-turn rendering cannot place the model's output"
        )
    user = [{"role": "user", "content": _USER}]
    plain = render_ids(tokenizer, user, add_generation_prompt=True, chat_template_kwargs=kwargs)
    with_tool = render_ids(
        tokenizer, user, tools=[_PROBE_TOOL], add_generation_prompt=True, chat_template_kwargs=kwargs
    )
    return TemplateFacts(
        prefix_ids=tuple(answered), end_of_turn=tuple(tail[len(content) :]), uses_tools=plain != with_tool
    )


def template_facts(
    tokenizer: Any,
    tools: Sequence[Mapping[str, Any]] | None = None,
    chat_template_kwargs: Mapping[str, Any] | None = None,
) -> TemplateFacts:
    """The :class:`TemplateFacts` of ``tokenizer``'s template (computed once per setting)."""
    return _facts(
        tokenizer,
        str(getattr(tokenizer, "chat_template", "")),
        # key order is kept: a template's tojson renders keys in the order given
        json.dumps(list(tools or []), default=str),
        json.dumps(dict(chat_template_kwargs or {}), default=str),
    )


class IncrementalRenderer:
    """Renders one trajectory's prompt and the tokens between its assistant turns.

    ``tools`` go to the template for every rendering (they only shape the system part, but a
    template may also read them elsewhere).
    """

    def __init__(
        self,
        tokenizer: Any,
        tools: Sequence[Mapping[str, Any]] | None = None,
        chat_template_kwargs: Mapping[str, Any] | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        self.tools = [dict(t) for t in tools] if tools else None
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        self.facts = template_facts(tokenizer, self.tools, self.chat_template_kwargs)

    @property
    def uses_tools(self) -> bool:
        """Whether the template renders ``tools`` (if not, describe them in the system prompt)."""
        return self.facts.uses_tools

    @property
    def end_of_turn(self) -> tuple[int, ...]:
        """The tokens the template closes an assistant turn with."""
        return self.facts.end_of_turn

    def separator_after(self, stop_token_id: int) -> tuple[int, ...]:
        """What :meth:`closing_ids` inserts after a turn that ended with ``stop_token_id``."""
        return tuple(self.closing_ids([stop_token_id]))

    def prompt_ids(self, messages: Sequence[Message]) -> list[int]:
        """The first prompt: ``messages`` with the generation prompt."""
        return render_ids(
            self.tokenizer,
            messages,
            tools=self.tools,
            add_generation_prompt=True,
            chat_template_kwargs=self.chat_template_kwargs,
        )

    def closing_ids(self, generated: Sequence[int]) -> list[int]:
        """The end-of-turn tokens the model did not produce after ``generated``.

        The longest head of the end-of-turn sequence that ``generated`` ends with counts as
        produced; the rest is returned. After ``…<|im_end|>`` that is ``\\n``; after a turn
        cut short (no stop token), the whole ``<|im_end|>\\n``.
        """
        eot = self.facts.end_of_turn
        for k in range(min(len(eot), len(generated)), 0, -1):
            if list(generated[len(generated) - k :]) == list(eot[:k]):
                return list(eot[k:])
        return list(eot)

    def message_ids(self, messages: Sequence[Message]) -> list[int]:
        """Tokens of ``messages`` following a closed assistant turn, through the next generation prompt."""
        if not messages:
            raise ValueError("message_ids needs at least one message")
        prefix = self.facts.prefix_ids
        full = render_ids(
            self.tokenizer,
            [*_synthetic_prefix(), *messages],
            tools=self.tools,
            add_generation_prompt=True,
            chat_template_kwargs=self.chat_template_kwargs,
        )
        if tuple(full[: len(prefix)]) != prefix:
            roles = ", ".join(str(m.get("role")) for m in messages)
            raise TemplateError(
                f"the chat template is not prefix-stable: appending messages with roles ({roles}) changes the tokens "
                "of the conversation before them, so they cannot be rendered incrementally"
            )
        return full[len(prefix) :]

    def continuation_ids(self, generated: Sequence[int], messages: Sequence[Message]) -> list[int]:
        """Everything between a generated turn and the next one: closing tokens, then the messages."""
        return self.closing_ids(generated) + self.message_ids(messages)
