"""A generative-judge reward: a judge model says whether the response answers the question.

    hybridflow train ... reward_model.enable=true reward_model.model.path=<judge model> \\
        custom_reward_function.path=examples/judge_reward.py

The trainer serves the judge (``hybridflow serve``) on loopback and passes its ``"host:port"``
as ``reward_router_address``. The score is the judge's probability of "yes" against "no",
``sigmoid(log p(yes) − log p(no))`` = ``p(yes) / (p(yes) + p(no))``, from the log-probs of
its first answer token (:func:`hybridflow.reward.judge.judge_yes_no`).

The question comes from the row's ``extra_info``: its ``question``, or for the built-in
``arithmetic`` task (whose ``extra_info`` holds ``expression`` and ``answer``) "What is
<expression>?". The ground truth is shown to the judge as the reference answer. Options such
as ``yes`` / ``no`` (the judge tokenizer's spellings) or ``judge_timeout_s`` can be bound with
``custom_reward_function.reward_kwargs``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from hybridflow.reward.judge import (
    NO,
    YES,
    JudgeError,
    judge_yes_no,
    render_judge_messages,
)


def _question(extra_info: dict[str, Any] | None) -> str:
    extra_info = extra_info or {}
    if extra_info.get("question"):
        return str(extra_info["question"])
    if extra_info.get("expression"):  # the arithmetic task's rows
        return f"What is {extra_info['expression']}?"
    raise ValueError(
        f"extra_info has no 'question' (or 'expression', as the arithmetic task writes) for the judge; "
        f"its keys: {sorted(extra_info)}"
    )


def _sigmoid(x: float) -> float:
    # Two branches so that exp never overflows for a very confident judge.
    if x >= 0:
        return 1.0 / (1.0 + math.exp(-x))
    z = math.exp(x)
    return z / (1.0 + z)


def compute_score(
    data_source: str,
    solution_str: str,
    ground_truth: Any,
    extra_info: dict[str, Any] | None = None,
    reward_router_address: str | None = None,
    reward_model_tokenizer: Any = None,
    *,
    yes: Sequence[str] = YES,
    no: Sequence[str] = NO,
    judge_timeout_s: float = 60.0,
    **kwargs: Any,
) -> dict[str, float]:
    """``{"score": p(yes | yes or no), "judge_logit": log-odds, "judge_exact": 1.0 or 0.0}``.

    ``judge_exact`` is 0.0 when "yes" or "no" was not among the judge's top 20 first tokens:
    the logit is then a bound (see ``judge_yes_no``). A judge that answers neither is an
    error (the reward manager scores the item 0 and counts it in ``reward/errors``).
    """
    if reward_router_address is None:
        raise ValueError(
            "this reward needs a judge model: set reward_model.enable=true and reward_model.model.path to a "
            "judge model, so that the trainer serves it and passes reward_router_address"
        )
    messages = render_judge_messages(_question(extra_info), solution_str, reference=str(ground_truth))
    verdict = judge_yes_no(reward_router_address, messages, yes=yes, no=no, timeout_s=judge_timeout_s)
    if verdict.bound == "none":
        raise JudgeError(f"the judge answered neither yes nor no (its most likely first token: {verdict.top_token!r})")
    return {"score": _sigmoid(verdict.score), "judge_logit": verdict.score, "judge_exact": float(verdict.exact)}
