"""How an RL prompt (chat messages) becomes token ids: through the tokenizer's chat template, or
— for a base model without one (``data.apply_chat_template=false``) — as plain text.

Plain text is the messages' contents joined by a blank line (a one-message prompt is its
content, unchanged), encoded as the tokenizer encodes any text: with its own special tokens
(Gemma's ``<bos>``, for instance), since that is how a base model saw text in pre-training. A
chat-templated prompt is encoded without them, because the template writes them itself.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from hybridflow.utils.errors import InputError

PLAIN_SEPARATOR = "\n\n"


class ChatTemplateError(InputError, ValueError):
    """Chat messages to render and no chat template to render them with."""


def plain_prompt_text(messages: Sequence[Mapping[str, Any]]) -> str:
    """The prompt as plain text: every message's content, in order, joined by a blank line."""
    return PLAIN_SEPARATOR.join(str(message["content"]) for message in messages)


def has_chat_template(tokenizer: Any) -> bool:
    """True when ``tokenizer`` has a (non-empty) chat template."""
    return bool(getattr(tokenizer, "chat_template", None))


def require_chat_template(tokenizer: Any) -> None:
    """Raise :class:`ChatTemplateError` naming the model when its tokenizer cannot render chat messages."""
    if has_chat_template(tokenizer):
        return
    name = getattr(tokenizer, "name_or_path", "") or "this model"
    raise ChatTemplateError(
        f"the tokenizer of {name} has no chat template (a base model?), and data.apply_chat_template=true "
        "renders prompts through one; set data.apply_chat_template=false to use each prompt's text as it is "
        "(its messages' contents joined by a blank line)"
    )


def prompt_token_ids(
    tokenizer: Any,
    conversations: Sequence[Sequence[Mapping[str, Any]]],
    apply_chat_template: bool = True,
    chat_template_kwargs: Mapping[str, Any] | None = None,
) -> list[list[int]]:
    """Token ids of each conversation, opened for the assistant's reply (chat template) or as plain
    text (``apply_chat_template=False``, see the module docstring)."""
    if not apply_chat_template:
        texts = [plain_prompt_text(messages) for messages in conversations]
        return [list(ids) for ids in tokenizer(texts, add_special_tokens=True)["input_ids"]]
    require_chat_template(tokenizer)
    kwargs = dict(chat_template_kwargs or {})
    texts = [
        tokenizer.apply_chat_template(list(messages), add_generation_prompt=True, tokenize=False, **kwargs)
        for messages in conversations
    ]
    return [list(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]]
