"""A custom reward that asks the served judge (reward_router_address) for one token and
scores the probability it gave that token: proves the address reached the scorer."""

import math

from hybridflow.reward.judge import chat_completion


def compute_score(data_source, solution_str, ground_truth, extra_info=None, reward_router_address=None, **kwargs):
    if reward_router_address is None:
        raise ValueError("no reward_router_address")
    messages = [{"role": "user", "content": f"Is {solution_str!r} equal to {ground_truth}? Answer yes or no."}]
    reply = chat_completion(reward_router_address, messages, max_tokens=1, temperature=0, logprobs=True)
    return math.exp(reply["choices"][0]["logprobs"]["content"][0]["logprob"])
