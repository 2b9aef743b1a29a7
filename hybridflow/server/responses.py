"""Response bodies: one sampled response (:class:`SampleOutput`) → an OpenAI choice or a /generate output.

Text is the response decoded without special tokens, cut before the earliest stop string
(OpenAI leaves it out). Log-probs are the sampler's: ``log softmax(z / T)`` of each token
(T = 1 for greedy), listed for every generated token including a final stop token.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from typing import Any

from hybridflow.agent.parsers import ToolParser
from hybridflow.inference.batcher_types import FINISH_STOP, SampleOutput
from hybridflow.server.text import TextCodec, truncate_at_stop
from hybridflow.server.tools import split_reply

FINISH_TOOL_CALLS = "tool_calls"


def reply_head(id_prefix: str, object_name: str, model: str) -> dict[str, Any]:
    """The fields an OpenAI reply or stream chunk starts with: a fresh id, object, created, model."""
    return {"id": f"{id_prefix}-{uuid.uuid4().hex}", "object": object_name, "created": int(time.time()), "model": model}


def text_and_reason(codec: TextCodec, out: SampleOutput, stops: Sequence[str]) -> tuple[str, str]:
    text, cut = truncate_at_stop(codec.decode(out.token_ids), stops)
    return text, FINISH_STOP if cut else str(out.finish_reason)


def completion_choice(
    codec: TextCodec, out: SampleOutput, index: int, stops: Sequence[str], logprobs: int | None
) -> dict[str, Any]:
    """A ``text_completion`` choice; ``logprobs`` (k ≥ 0) adds tokens, token_logprobs, top_logprobs, text_offset."""
    text, reason = text_and_reason(codec, out, stops)
    choice: dict[str, Any] = {"index": index, "text": text, "finish_reason": reason, "logprobs": None}
    if logprobs is not None:
        tokens = codec.token_strings(out.token_ids)
        offsets, at = [], 0
        for token in tokens:
            offsets.append(at)
            at += len(token)
        tops = None
        if logprobs > 0:
            tops = [
                {name: lp for name, (_, lp) in zip(codec.token_strings([i for i, _ in top]), top, strict=True)}
                for top in out.top_logprobs
            ]
        choice["logprobs"] = {
            "tokens": tokens,
            "token_logprobs": list(out.logprobs),
            "top_logprobs": tops,
            "text_offset": offsets,
        }
    return choice


def _token_entry(token: str, logprob: float) -> dict[str, Any]:
    return {"token": token, "logprob": logprob, "bytes": list(token.encode("utf-8"))}


def chat_message(text: str, reason: str, tool_parser: ToolParser | None) -> tuple[dict[str, Any], str]:
    """The assistant message of a reply and its finish reason: with ``tool_parser``, readable
    calls become ``tool_calls`` (finish reason ``"tool_calls"``) and ``content`` is the rest
    (``None`` if nothing is left)."""
    content, calls = split_reply(text, tool_parser)
    if not calls:
        return {"role": "assistant", "content": text}, reason
    return {"role": "assistant", "content": content, "tool_calls": calls}, FINISH_TOOL_CALLS


def chat_choice(
    codec: TextCodec,
    out: SampleOutput,
    index: int,
    stops: Sequence[str],
    logprobs: bool,
    tool_parser: ToolParser | None = None,
) -> dict[str, Any]:
    """A ``chat.completion`` choice; ``logprobs`` adds ``{"content": [{token, logprob, bytes, top_logprobs}]}``;
    ``tool_parser`` (tools offered, ``tool_choice`` not ``"none"``) turns calls into ``tool_calls``."""
    text, reason = text_and_reason(codec, out, stops)
    message, reason = chat_message(text, reason, tool_parser)
    choice: dict[str, Any] = {
        "index": index,
        "message": message,
        "finish_reason": reason,
        "logprobs": None,
    }
    if logprobs:
        content = []
        for token, lp, top in zip(codec.token_strings(out.token_ids), out.logprobs, out.top_logprobs, strict=True):
            names = codec.token_strings([i for i, _ in top])
            alternatives = [_token_entry(name, alt) for name, (_, alt) in zip(names, top, strict=True)]
            content.append({**_token_entry(token, lp), "top_logprobs": alternatives})
        choice["logprobs"] = {"content": content}
    return choice


def generate_output(prompt_index: int, out: SampleOutput) -> dict[str, Any]:
    """One ``/generate`` output: ids, their log-probs, top alternatives (if asked) and the finish reason."""
    return {
        "prompt_index": prompt_index,
        "output_ids": list(out.token_ids),
        "logprobs": list(out.logprobs),
        "top_logprobs": [[[i, lp] for i, lp in top] for top in out.top_logprobs] if any(out.top_logprobs) else None,
        "finish_reason": out.finish_reason,
        "weight_version": out.weight_version,
        **({"prompt_logprobs": list(out.prompt_logprobs)} if out.prompt_logprobs is not None else {}),
        **(
            {"prompt_top_logprobs": [[[i, lp] for i, lp in top] for top in out.prompt_top_logprobs]}
            if out.prompt_top_logprobs is not None
            else {}
        ),
    }


def usage(prompts: Sequence[Sequence[int]], results: Sequence[Sequence[SampleOutput]]) -> dict[str, int]:
    """OpenAI usage: prompt tokens counted once per prompt, completion tokens over all responses."""
    prompt_tokens = sum(len(p) for p in prompts)
    completion_tokens = sum(len(out.token_ids) for outputs in results for out in outputs)
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }
