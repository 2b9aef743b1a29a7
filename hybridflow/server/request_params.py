"""From a request body to the sampler's settings: the checks that need the served model.

The schemas check a body's shape and :mod:`hybridflow.server.checks` its caps; what is left
needs the :class:`~hybridflow.server.state.ServerState`: the model's name, its vocabulary, its
context (the token budget of a reply) and its EOS ids. Each check raises
:class:`~hybridflow.server.checks.BadRequest` naming the parameter.
"""

from __future__ import annotations

from collections.abc import Sequence

from hybridflow.inference.sampling import GenerationParams
from hybridflow.server.checks import BadRequest, check_text
from hybridflow.server.schemas import OpenAISampling
from hybridflow.server.state import ServerState


def check_model(state: ServerState, name: str) -> None:
    if name != state.model_name:
        raise BadRequest(f"model {name!r} is not served here; available: {state.model_name!r}", "model")


def check_ids(state: ServerState, prompt: Sequence[int], param: str) -> None:
    if not prompt:
        raise BadRequest("prompt has no tokens", param)
    state.limits.check_prompt_tokens(len(prompt), param)
    bad = [t for t in prompt if not 0 <= t < state.codec.vocab_size]
    if bad:
        raise BadRequest(f"token ids {bad[:5]} are outside the vocabulary [0, {state.codec.vocab_size})", param)


def token_budget(state: ServerState, prompt_len: int, limit: int | None, param: str) -> int:
    """max_new_tokens for a prompt: the request's limit, or what is left of the context."""
    room = state.max_model_len - prompt_len
    if room < 1:
        raise BadRequest(f"prompt is {prompt_len} tokens; the model's context is {state.max_model_len}", param)
    if limit is None:
        return min(state.default_max_tokens, room)
    if limit > room:
        raise BadRequest(
            f"prompt ({prompt_len} tokens) + {param}={limit} exceeds the model's context of {state.max_model_len}",
            param,
        )
    return limit


def generation_params(
    state: ServerState,
    max_new: int,
    temperature: float,
    top_k: int,
    top_p: float,
    n: int,
    ignore_eos: bool,
    extra_stops: Sequence[int] = (),
) -> GenerationParams:
    """The sampler's settings for one request; EOS ids always stop (unless ``ignore_eos``)."""
    try:
        return GenerationParams(
            max_new_tokens=max_new,
            temperature=temperature,
            top_k=top_k,
            top_p=top_p,
            do_sample=temperature > 0,
            n=n,
            stop_token_ids=tuple(dict.fromkeys((*state.eos_token_ids, *extra_stops))),
            ignore_eos=ignore_eos,
        )
    except ValueError as err:
        raise BadRequest(str(err)) from err


def openai_params(state: ServerState, body: OpenAISampling, max_new: int) -> GenerationParams:
    """:func:`generation_params` of an OpenAI-style body (completions, chat)."""
    return generation_params(state, max_new, body.temperature, body.top_k, body.top_p, body.n, body.ignore_eos)


def prompt_params(
    state: ServerState, body: OpenAISampling, prompt: Sequence[int], param: str, limit: int | None
) -> GenerationParams:
    """Check ``prompt``'s ids (``param`` names it in errors) and give the sampler's settings for
    it: a reply of at most ``limit`` tokens (None: what the context leaves, capped by default)."""
    check_ids(state, prompt, param)
    return openai_params(state, body, token_budget(state, len(prompt), limit, "max_tokens"))


def check_common(state: ServerState, body: OpenAISampling) -> None:
    """The checks every OpenAI-style body passes: its text, the model name, ``n``, the stops."""
    check_text(body.model_dump(exclude_none=True))
    check_model(state, body.model)
    state.limits.check_n(body.n)
    state.limits.check_stops(body.stop_strings(), "stop")
