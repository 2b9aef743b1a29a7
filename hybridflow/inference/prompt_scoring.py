"""The log-probability a model gives each token of a prompt (vLLM's ``prompt_logprobs``).

A teacher in on-policy distillation scores the student's tokens; a server answers
``prompt_logprobs`` with the same numbers. One forward over the whole sequence: position i's
logits give log p(token[i + 1] | token[:i + 1]), at temperature 1 (the model's own
distribution, whatever temperature a request samples at).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

TopLogProbs = list[list[tuple[int, float]]]


@torch.inference_mode()
def prompt_log_probs(model: nn.Module, prompt_ids: Sequence[int], k: int = 0) -> tuple[list[float], TopLogProbs | None]:
    """``(log_probs, top)`` for ``prompt_ids[1:]``: the log-prob of each token given the ones
    before it (len(prompt) − 1 values), and, when ``k`` > 0, the ``k`` most likely
    ``(token id, log-prob)`` at each of those positions (None when ``k`` = 0)."""
    if k < 0:
        raise ValueError(f"prompt_logprobs must be >= 0, got {k}")
    if len(prompt_ids) < 2:
        return [], ([] if k > 0 else None)
    device = next(model.parameters()).device
    ids = torch.tensor([list(prompt_ids)], dtype=torch.long, device=device)
    logits = model(input_ids=ids, use_cache=False).logits[0, :-1].float()
    log_probs = torch.log_softmax(logits, dim=-1)
    picked = log_probs.gather(-1, ids[0, 1:, None])[:, 0]
    if not bool(torch.isfinite(picked).all()):
        raise ValueError("the model's prompt log-probs are not finite (NaN or inf logits)")
    top = None
    if k > 0:
        values, indices = log_probs.topk(min(k, log_probs.shape[-1]), dim=-1)
        top = [list(zip(i, v, strict=True)) for i, v in zip(indices.tolist(), values.tolist(), strict=True)]
    return picked.tolist(), top
