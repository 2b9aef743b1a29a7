"""Text ↔ token ids for the server: prompts, chat templates, decoding, stop strings.

Hugging Face fast tokenizers keep mutable state (padding / truncation settings) in the Rust
object; two threads encoding at once can fail with "Already borrowed". The HTTP thread
encodes prompts while the engine thread decodes responses for stop strings, so every call
goes through one lock.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Sequence
from typing import Any

from jinja2 import TemplateError, UndefinedError

from hybridflow.inference.batcher_types import StopCheck


class TextCodec:
    """Thread-safe wrapper of a Hugging Face tokenizer with the few operations the server needs."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self._lock = threading.Lock()

    @property
    def vocab_size(self) -> int:
        return len(self.tokenizer)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of ``text`` (``add_special_tokens``: the tokenizer's own BOS etc., if any)."""
        with self._lock:
            return list(self.tokenizer(text, add_special_tokens=add_special_tokens)["input_ids"])

    def chat_prompt_ids(
        self, messages: list[dict[str, Any]], template_kwargs: dict[str, Any] | None = None
    ) -> list[int]:
        """The tokenizer's chat template with the assistant turn opened, as ids.

        Same steps as the RL dataset (render to text, then encode without adding specials),
        so a prompt served here tokenizes exactly as it does in training.

        Raises ``ValueError`` worded for the client when the template cannot render the
        messages: its own ``raise_exception`` text (written for users), the field it missed,
        or that it failed on their shape — never jinja's internal wording.
        """
        if not getattr(self.tokenizer, "chat_template", None):
            raise ValueError("this model's tokenizer has no chat template; use /v1/completions instead")
        with self._lock:
            try:
                text = self.tokenizer.apply_chat_template(
                    messages, add_generation_prompt=True, tokenize=False, **(template_kwargs or {})
                )
            except UndefinedError as err:  # e.g. "'dict object' has no attribute 'content'"
                raise ValueError(
                    f"the chat template needs {_missing_name(err)}, which these messages do not give"
                ) from err
            except TemplateError as err:  # e.g. the template's raise_exception("roles must alternate")
                raise ValueError(str(err)) from err
            except (TypeError, KeyError, AttributeError, IndexError) as err:  # a value of a shape it does not expect
                raise ValueError(
                    "the chat template cannot render these messages (a field has a type or shape it does not expect)"
                ) from err
            return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        with self._lock:
            return self.tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def token_strings(self, ids: Sequence[int]) -> list[str]:
        """Each id decoded on its own (special tokens kept), for logprob listings."""
        with self._lock:
            return [self.tokenizer.decode([i], skip_special_tokens=False) for i in ids]

    def stop_check(self, stops: Sequence[str]) -> StopCheck | None:
        """A check for the batcher: True once the decoded response contains any of ``stops``."""
        if not stops:
            return None
        stops = tuple(stops)

        def check(ids: Sequence[int]) -> bool:
            text = self.decode(ids)
            return any(stop in text for stop in stops)

        return check


def _missing_name(err: UndefinedError) -> str:
    match = re.search(r"has no attribute '([^']+)'|'([^']+)' is undefined", str(err))
    return f"the field {next(g for g in match.groups() if g)!r}" if match else "a field"


def truncate_at_stop(text: str, stops: Sequence[str]) -> tuple[str, bool]:
    """``text`` cut before the earliest stop string (OpenAI leaves the stop string out), and
    whether one was found."""
    cut = min((i for i in (text.find(stop) for stop in stops) if i >= 0), default=-1)
    return (text, False) if cut < 0 else (text[:cut], True)
