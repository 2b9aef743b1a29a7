"""Fixtures for the agent-loop tests: tiny tokenizers with real chat templates, a scripted client.

The tiny byte-level tokenizer (built in code, milliseconds) gets two templates: SmolLM2's
ChatML (ignores ``tools``, adds a default system prompt) and a Qwen2.5-style template that
renders ``tools`` into the system prompt and tool results as ``<tool_response>`` user turns.
The scripted client answers each ``generate`` with the next fixed list of ids, so every test
knows exactly which tokens the "model" produced.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pytest

from hybridflow.inference.protocol import SamplingParams, TokenOutput
from hybridflow.models.tiny import build_tiny_tokenizer

SMOLLM2_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}"
    "{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

QWEN2_TEMPLATE = (
    "{%- if tools %}"
    "{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0]['role'] == 'system' %}{{- messages[0]['content'] }}"
    "{%- else %}{{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}{%- endif %}"
    "{{- \"\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n"
    "You are provided with function signatures within <tools></tools> XML tags:\\n<tools>\" }}"
    "{%- for tool in tools %}{{- \"\\n\" }}{{- tool | tojson }}{%- endfor %}"
    "{{- \"\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments "
    "within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\\"name\\\": <function-name>, \\\"arguments\\\": "
    "<args-json-object>}\\n</tool_call><|im_end|>\\n\" }}"
    "{%- else %}"
    "{%- if messages[0]['role'] == 'system' %}{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{%- else %}{{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if (message.role == 'user') or (message.role == 'system' and not loop.first) "
    "or (message.role == 'assistant' and not message.tool_calls) %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}"
    "{%- elif message.role == 'tool' %}"
    "{%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != 'tool') %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' }}{{- message.content }}{{- '\\n</tool_response>' }}"
    "{%- if loop.last or (messages[loop.index0 + 1].role != 'tool') %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def _tokenizer(template: str) -> Any:
    tok = build_tiny_tokenizer()
    tok.chat_template = template
    return tok


@pytest.fixture(scope="session")
def smol_tokenizer() -> Any:
    """The tiny tokenizer with SmolLM2's chat template (ignores tools)."""
    return _tokenizer(SMOLLM2_TEMPLATE)


@pytest.fixture(scope="session")
def qwen_tokenizer() -> Any:
    """The tiny tokenizer with a Qwen2.5-style chat template (renders tools)."""
    return _tokenizer(QWEN2_TEMPLATE)


class ScriptedClient:
    """A TokenClient that replays fixed turns.

    Turn ``k``'s token ``j`` gets log-prob ``-(k + 1) - j / 100`` (distinct, never 0). A turn
    longer than ``max_tokens`` is cut and reported as ``length``. Every call is recorded.
    """

    def __init__(self, turns: Sequence[Sequence[int]], stop_reasons: Sequence[str] | None = None) -> None:
        self.turns = [list(t) for t in turns]
        self.stop_reasons = list(stop_reasons) if stop_reasons is not None else ["completed"] * len(self.turns)
        self.calls: list[dict[str, Any]] = []

    @staticmethod
    def log_prob(turn: int, position: int) -> float:
        return -(turn + 1) - position / 100

    async def generate(
        self, request_id: str, prompt_ids: list[int], sampling: SamplingParams, max_tokens: int
    ) -> TokenOutput:
        k = len(self.calls)
        self.calls.append({"request_id": request_id, "prompt_ids": list(prompt_ids), "max_tokens": max_tokens})
        if k >= len(self.turns):
            raise AssertionError(f"the scripted client has {len(self.turns)} turns; turn {k} was asked for")
        ids, reason = self.turns[k], self.stop_reasons[k]
        if len(ids) > max_tokens:
            ids, reason = ids[:max_tokens], "length"
        return TokenOutput(
            token_ids=ids, log_probs=[self.log_prob(k, j) for j in range(len(ids))], stop_reason=reason, weight_version=3
        )


@pytest.fixture
def scripted() -> type[ScriptedClient]:
    return ScriptedClient


@pytest.fixture
def turn_ids() -> Callable[[Any, str], list[int]]:
    """tokenizer, text → the ids of one assistant turn ending with the stop token ``<|im_end|>``."""

    def make(tokenizer: Any, text: str) -> list[int]:
        return tokenizer.encode(text, add_special_tokens=False) + [tokenizer.eos_token_id]

    return make
