"""Request bodies of the server's endpoints (pydantic models; a body that does not fit is a 400).

Field names and defaults are OpenAI's (``max_tokens`` 16 for completions, ``n`` 1,
``temperature`` 1, ``top_p`` 1), plus the common open-source extensions ``top_k``,
``ignore_eos`` and ``chat_template_kwargs`` (vLLM's names). Parameters we do not implement
are accepted only at their neutral value (``presence_penalty=0``, ``echo=false``, ...), so
a client never silently gets something other than what it asked for. Unknown fields and
wrong types (``"max_tokens": "ten"``, ``"n": true``) are rejected.

Sampling values are held to ranges the float32 sampler survives. The sampler divides float32
logits by the temperature and compares float32 probability mass with ``top_p``; a Python float
such as ``1e-300`` becomes 0 in float32, and then every probability is NaN. So: ``temperature``
is 0 (greedy) or in [:data:`MIN_TEMPERATURE`, :data:`MAX_TEMPERATURE`], ``top_p`` in
[:data:`MIN_TOP_P`, 1], no NaN or infinity anywhere (Python's JSON reader accepts ``NaN``),
and ``seed`` is a signed 64-bit integer, as in OpenAI's API.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from hybridflow.server.checks import check_depth

MAX_TOP_LOGPROBS = 20
# Below 1e-3 sampling is greedy for every logit gap above ~0.02 anyway, and logits / T stays
# many orders of magnitude inside float32's range for any real model's logits; above 100 the
# distribution of any real model is uniform noise.
MIN_TEMPERATURE, MAX_TEMPERATURE = 1e-3, 100.0
# float32 resolves probability mass to ~1e-7; a smaller top_p means "the top token" all the same.
MIN_TOP_P = 1e-6
SEED_MIN, SEED_MAX = -(2**63), 2**63 - 1
TOP_K_MAX = 2**31 - 1


def _check_temperature(value: float) -> float:
    if 0 < value < MIN_TEMPERATURE:
        raise ValueError(
            f"temperature must be 0 (greedy) or at least {MIN_TEMPERATURE:g}: smaller values underflow the "
            "float32 sampler; send 0 for greedy decoding"
        )
    return value


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _not_too_deep(cls, data: Any) -> Any:
        # Before any field is read: the template helpers, jinja and pydantic's own serializer
        # recurse into nested values (chat_template_kwargs, tools), and a RecursionError there
        # was a 500 with a traceback thousands of lines long.
        check_depth(data)
        return data


class StreamOptions(_Body):
    """``stream_options``: ``include_usage`` adds a last chunk with ``usage`` (and ``choices: []``)."""

    include_usage: bool = False


class OpenAISampling(_Body):
    """Sampling fields shared by the two OpenAI endpoints."""

    model: str
    temperature: float = Field(default=1.0, ge=0, le=MAX_TEMPERATURE, description="0 = greedy")
    top_p: float = Field(default=1.0, ge=MIN_TOP_P, le=1)
    top_k: int = Field(default=-1, ge=-1, le=TOP_K_MAX, description="extension; -1 or 0 = off")
    n: int = Field(default=1, ge=1)
    max_tokens: int | None = Field(default=None, ge=1)
    stop: str | list[str] | None = None
    seed: int | None = Field(default=None, ge=SEED_MIN, le=SEED_MAX)
    ignore_eos: bool = Field(default=False, description="extension: keep generating past the end-of-sequence token")
    stream: bool = False
    stream_options: StreamOptions | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict[str, float] | None = None
    user: str | None = None

    _temperature_range = field_validator("temperature")(_check_temperature)

    @model_validator(mode="after")
    def _neutral_unsupported(self) -> OpenAISampling:
        if self.stream_options is not None and not self.stream:
            raise ValueError("stream_options needs stream=true")
        if self.presence_penalty != 0 or self.frequency_penalty != 0:
            raise ValueError("presence_penalty / frequency_penalty are not supported; leave them at 0")
        if self.logit_bias:
            raise ValueError("logit_bias is not supported")
        if self.stop == "" or (isinstance(self.stop, list) and any(not s for s in self.stop)):
            raise ValueError("stop strings must be non-empty")
        return self

    def stop_strings(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)


class CompletionRequest(OpenAISampling):
    """``POST /v1/completions``: a text prompt (or several, or token ids) to continue."""

    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int | None = Field(default=16, ge=1)
    logprobs: int | None = Field(default=None, ge=0, le=MAX_TOP_LOGPROBS)
    echo: bool = False
    best_of: int | None = None
    suffix: str | None = None

    @model_validator(mode="after")
    def _neutral_completion_fields(self) -> CompletionRequest:
        if self.echo:
            raise ValueError("echo=true is not supported")
        if self.suffix:
            raise ValueError("suffix is not supported")
        if self.best_of is not None and self.best_of != self.n:
            raise ValueError("best_of other than n is not supported")
        if isinstance(self.prompt, list) and not self.prompt:
            raise ValueError("prompt is an empty list")
        if self.stream and self.logprobs is not None:
            raise ValueError("logprobs with stream=true is not supported; send stream=false for log-probs")
        return self


class ChatMessage(BaseModel):
    """One chat message; extra keys (``tool_calls``, ``name``, ...) are handed to the chat template."""

    model_config = ConfigDict(extra="allow", strict=True, allow_inf_nan=False)

    role: str = Field(min_length=1)
    content: str | list[dict[str, Any]] | None = None

    @model_validator(mode="after")
    def _content_present(self) -> ChatMessage:
        # OpenAI's rule: only an assistant turn that calls tools may leave its text out. A chat
        # template reading ``message.content`` of any other null message fails deep inside jinja.
        if self.content is None and not (self.role == "assistant" and getattr(self, "tool_calls", None)):
            raise ValueError(
                f"content is missing or null in a {self.role!r} message; only an assistant message with "
                "tool_calls may leave it out"
            )
        return self

    def template_dict(self) -> dict[str, Any]:
        """The message as the chat template expects it: text parts joined into one string."""
        message = self.model_dump(exclude_none=True)
        if isinstance(self.content, list):
            texts = []
            for j, part in enumerate(self.content):
                if part.get("type") != "text" or not isinstance(part.get("text"), str):
                    raise ValueError(f"content part {j}: only {{'type': 'text', 'text': ...}} parts are supported")
                texts.append(part["text"])
            message["content"] = "".join(texts)
        return message


class ChatCompletionRequest(OpenAISampling):
    """``POST /v1/chat/completions``: messages rendered with the tokenizer's chat template."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=MAX_TOP_LOGPROBS)
    chat_template_kwargs: dict[str, Any] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = Field(default=None, description="'auto' (default) or 'none'")

    @model_validator(mode="after")
    def _check_chat_fields(self) -> ChatCompletionRequest:
        if self.top_logprobs and not self.logprobs:
            raise ValueError("top_logprobs needs logprobs=true")
        if self.stream and self.logprobs:
            raise ValueError("logprobs with stream=true is not supported; send stream=false for log-probs")
        if self.max_tokens is not None and self.max_completion_tokens is not None:
            raise ValueError("give max_tokens or max_completion_tokens, not both")
        return self

    def token_limit(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


class GenerateSamplingParams(_Body):
    """``sampling_params`` of ``POST /generate`` (the sampler's own names)."""

    max_new_tokens: int = Field(default=16, ge=0)  # 0: score the prompt only (needs prompt_logprobs)
    temperature: float = Field(default=1.0, ge=0, le=MAX_TEMPERATURE)
    top_p: float = Field(default=1.0, ge=MIN_TOP_P, le=1)
    top_k: int = Field(default=-1, ge=-1, le=TOP_K_MAX)
    n: int = Field(default=1, ge=1)
    stop_token_ids: list[int] = Field(default_factory=list)
    ignore_eos: bool = False
    seed: int | None = Field(default=None, ge=SEED_MIN, le=SEED_MAX)

    _temperature_range = field_validator("temperature")(_check_temperature)


class GenerateRequest(_Body):
    """``POST /generate``: token ids in, token ids and log-probs out (one prompt or a list)."""

    input_ids: list[int] | list[list[int]] = Field(min_length=1)
    sampling_params: GenerateSamplingParams = Field(default_factory=GenerateSamplingParams)
    top_logprobs: int = Field(default=0, ge=0, le=MAX_TOP_LOGPROBS)
    # Not None: also the log-prob of each prompt token (after the first), and the k best when > 0.
    prompt_logprobs: int | None = Field(default=None, ge=0, le=MAX_TOP_LOGPROBS)

    def prompts(self) -> list[list[int]]:
        if isinstance(self.input_ids[0], list):
            return [list(p) for p in self.input_ids]
        return [list(self.input_ids)]


class UpdateWeightsRequest(_Body):
    """``POST /update_weights_from_disk``: reload the weights from a Hugging Face folder."""

    model_path: str = Field(min_length=1)
    version: int | None = Field(default=None, ge=0)  # the weight_version to report afterwards (default: + 1)


class SleepRequest(_Body):
    """``POST /sleep``: free the KV cache (level 1) and the weights too (level 2)."""

    level: int = Field(default=1, ge=1, le=2)


class WakeUpRequest(_Body):
    """``POST /wake_up``: re-allocate ``weights`` and/or ``kv_cache`` (null: both)."""

    tags: list[str] | None = None
