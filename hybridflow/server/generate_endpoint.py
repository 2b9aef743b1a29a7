"""``POST /generate``: token ids in, token ids out, with the sampler's log-probs (SGLang's shape).

What a trainer's rollout or a teacher calls: no text, no chat template. ``max_new_tokens`` = 0
generates nothing and only scores the prompts (``prompt_logprobs``).
"""

from __future__ import annotations

import asyncio

from fastapi import Request

from hybridflow.inference.batcher_types import GenRequest, SampleOutput
from hybridflow.server.checks import BadRequest
from hybridflow.server.engine_calls import run_requests
from hybridflow.server.request_params import check_ids, generation_params, token_budget
from hybridflow.server.responses import generate_output, usage
from hybridflow.server.schemas import GenerateRequest
from hybridflow.server.state import ServerState


async def generate(state: ServerState, request: Request, body: GenerateRequest) -> dict:
    sp = body.sampling_params
    state.limits.check_n(sp.n, "sampling_params.n")
    state.limits.check_stops(sp.stop_token_ids, "sampling_params.stop_token_ids")
    prompts = body.prompts()
    state.limits.check_prompts(len(prompts), "input_ids")
    for prompt in prompts:
        check_ids(state, prompt, "input_ids")
    if sp.max_new_tokens == 0:
        return await _score_prompts(state, body, prompts)
    requests = []
    for prompt in prompts:
        token_budget(state, len(prompt), sp.max_new_tokens, "max_new_tokens")
        params = generation_params(
            state, sp.max_new_tokens, sp.temperature, sp.top_k, sp.top_p, sp.n, sp.ignore_eos, sp.stop_token_ids
        )
        requests.append(GenRequest(tuple(prompt), params, body.top_logprobs, None, sp.seed))
    state.limits.check_request_tokens([sp.max_new_tokens] * len(requests), sp.n, "sampling_params.max_new_tokens")
    results = await run_requests(state, request, requests, body.prompt_logprobs)
    outputs = [generate_output(i, out) for i, group in enumerate(results) for out in group]
    return {"model": state.model_name, "outputs": outputs, "usage": usage(prompts, results)}


async def _score_prompts(state: ServerState, body: GenerateRequest, prompts: list[list[int]]) -> dict:
    """``max_new_tokens`` = 0: the prompts' log-probs only (a teacher scoring a student's tokens)."""
    if body.prompt_logprobs is None:
        raise BadRequest(
            "max_new_tokens=0 generates nothing: set prompt_logprobs to score the prompt", "max_new_tokens"
        )
    scores = [await asyncio.wrap_future(state.engine.score_prompt(p, body.prompt_logprobs)) for p in prompts]
    outputs = [
        generate_output(i, SampleOutput(finish_reason="length", prompt_logprobs=lp, prompt_top_logprobs=top))
        for i, (lp, top) in enumerate(scores)
    ]
    return {"model": state.model_name, "outputs": outputs, "usage": usage(prompts, [[] for _ in prompts])}
