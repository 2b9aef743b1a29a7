"""Generative-judge rewards: ask a judge model behind an OpenAI-compatible server a yes/no
question and read its verdict from the log-probs of its first answer token.

A custom reward function with a ``reward_router_address`` argument (verl's convention:
``"host:port"`` of the judge's server, e.g. ``hybridflow serve`` started by the trainer when
``reward_model.enable=true``) calls :func:`judge_yes_no` or :func:`yes_no_logit`. The verdict
is a log-odds, not a sampled word, so it is a smooth score:

    score = log Σ_{t ∈ yes} p(t | prompt) − log Σ_{t ∈ no} p(t | prompt)

over the first generated token. With one token per side the softmax normaliser cancels and
``score = z_yes − z_no = (W[yes] − W[no]) · h``, ``h`` the last hidden state of the prompt and
``W`` the LM head: the judge *is* a classifier reward model whose 1×H head is
``W[yes] − W[no]``. The server lists only the top K ≤ 20 tokens; see :func:`judge_yes_no` for
what happens when a side is not among them.

Standard library HTTP only (``urllib``): a reward function runs in the reward manager's
scorer processes, which should not need an async HTTP stack for one blocking request.
"""

from __future__ import annotations

import http.client
import json
import math
import os
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

# The variable `hybridflow serve` reads its key from: a judge server started by the trainer
# inherits it, and so do the scorer processes, so the key matches without configuration.
API_KEY_ENV = "HYBRIDFLOW_API_KEY"
YES: tuple[str, ...] = ("yes", "Yes", " yes", " Yes")
NO: tuple[str, ...] = ("no", "No", " no", " No")
DEFAULT_TOP_LOGPROBS = 20  # the most the OpenAI API (and hybridflow serve) lists
DEFAULT_TIMEOUT_S = 60.0
JUDGE_TEMPLATE = "Question: {question}\n\nAnswer: {response}\n\nIs this answer correct? Answer yes or no."
JUDGE_TEMPLATE_WITH_REFERENCE = (
    "Question: {question}\n\nReference answer: {reference}\n\nAnswer: {response}\n\n"
    "Is this answer correct? Answer yes or no."
)

# base URL → the model name it serves; the name is fixed for a server's lifetime, so one
# GET /v1/models per scorer process and address is enough.
_SERVED_MODELS: dict[str, str] = {}


class JudgeError(RuntimeError):
    """The judge could not be reached, refused the request, or gave no usable verdict."""


def base_url(address: str) -> str:
    """``http://host:port`` for ``"host:port"`` (verl's ``reward_router_address``), a URL with
    a scheme, or an OpenAI base URL ending in ``/v1``."""
    url = address.strip().rstrip("/")
    if not url:
        raise ValueError("the judge address is empty; expected 'host:port'")
    if "://" not in url:
        url = "http://" + url
    return url.removesuffix("/v1")


def _error_message(raw: bytes) -> str:
    """The ``error.message`` of an OpenAI-style error body, else the start of the body."""
    try:
        body = json.loads(raw)
    except ValueError:
        return raw.decode("utf-8", errors="replace").strip()[:500] or "(empty body)"
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict) and "message" in error:
        return str(error["message"])
    if isinstance(body, dict) and "detail" in body:  # FastAPI's own error shape
        return str(body["detail"])
    return json.dumps(body)[:500]


def _request(url: str, body: dict[str, Any] | None, timeout_s: float, api_key: str | None) -> dict[str, Any]:
    """One JSON request (POST with ``body``, else GET); every failure is a :class:`JudgeError`
    naming ``url``."""
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method="GET" if body is None else "POST", headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            raw = response.read()
    except urllib.error.HTTPError as err:
        raise JudgeError(f"judge at {url} answered HTTP {err.code}: {_error_message(err.read())}") from None
    except TimeoutError:
        raise JudgeError(f"judge at {url} did not answer within {timeout_s:g} s") from None
    except (urllib.error.URLError, OSError, http.client.HTTPException) as err:
        reason = getattr(err, "reason", err)
        if isinstance(reason, TimeoutError):
            raise JudgeError(f"judge at {url} did not answer within {timeout_s:g} s") from None
        raise JudgeError(
            f"cannot reach the judge at {url}: {reason}. Is its server running? (the trainer starts one with "
            "reward_model.enable=true and reward_model.model.path=<judge model>)"
        ) from None
    try:
        reply = json.loads(raw)
    except ValueError:
        raise JudgeError(f"judge at {url} answered with a body that is not JSON: {raw[:200]!r}") from None
    if not isinstance(reply, dict):
        raise JudgeError(f"judge at {url} answered {type(reply).__name__}, expected a JSON object")
    return reply


def served_model(address: str, *, timeout_s: float = DEFAULT_TIMEOUT_S, api_key: str | None = None) -> str:
    """The first model the server at ``address`` lists on ``/v1/models`` (cached per address)."""
    root = base_url(address)
    if root not in _SERVED_MODELS:
        url = root + "/v1/models"
        reply = _request(url, None, timeout_s, api_key if api_key is not None else os.environ.get(API_KEY_ENV))
        try:
            _SERVED_MODELS[root] = str(reply["data"][0]["id"])
        except (KeyError, IndexError, TypeError):
            raise JudgeError(f"judge at {url} lists no model: {json.dumps(reply)[:300]}") from None
    return _SERVED_MODELS[root]


def chat_completion(
    address: str,
    messages: Sequence[dict[str, Any]],
    *,
    model: str | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    api_key: str | None = None,
    **sampling: Any,
) -> dict[str, Any]:
    """``POST {address}/v1/chat/completions``: the server's reply as a dict.

    ``model`` defaults to the one the server serves (:func:`served_model`); ``api_key`` to
    ``$HYBRIDFLOW_API_KEY`` (none if unset). ``sampling`` holds any other request fields
    (``max_tokens``, ``temperature``, ``logprobs``, ...). Raises :class:`JudgeError` naming the
    URL when the server cannot be reached, does not answer within ``timeout_s``, or answers
    other than 200 (with the server's own error message).
    """
    api_key = api_key if api_key is not None else os.environ.get(API_KEY_ENV)
    if model is None:
        model = served_model(address, timeout_s=timeout_s, api_key=api_key)
    body = {"model": model, "messages": list(messages), **sampling}
    return _request(base_url(address) + "/v1/chat/completions", body, timeout_s, api_key)


def render_judge_messages(
    question: str, response: str, *, reference: str | None = None, template: str | None = None
) -> list[dict[str, str]]:
    """One user message asking whether ``response`` answers ``question`` correctly, to be
    answered yes or no (with ``reference``, the reference answer is shown too).

    ``template`` is a ``str.format`` string with ``{question}``, ``{response}`` and, when a
    reference is given, ``{reference}``; default :data:`JUDGE_TEMPLATE` /
    :data:`JUDGE_TEMPLATE_WITH_REFERENCE`.
    """
    if template is None:
        template = JUDGE_TEMPLATE if reference is None else JUDGE_TEMPLATE_WITH_REFERENCE
    fields = {"question": question, "response": response}
    if reference is not None:
        fields["reference"] = reference
    return [{"role": "user", "content": template.format(**fields)}]


@dataclass(frozen=True)
class Verdict:
    """A yes/no verdict from the first answer token's top-K log-probs.

    ``yes_logprob`` / ``no_logprob`` are ``log Σ p`` over the listed variants of each side;
    for a side with no variant listed (``yes_listed`` / ``no_listed`` false) they are the upper
    bound ``lp_K + log m`` (``lp_K`` the lowest listed log-prob, ``m`` the side's number of
    variants). ``score = yes_logprob − no_logprob``. ``top_token`` is the most likely token.
    """

    score: float
    yes_logprob: float
    no_logprob: float
    yes_listed: bool
    no_listed: bool
    top_token: str

    @property
    def exact(self) -> bool:
        """Both sides were among the top K: ``score`` is the log-odds itself."""
        return self.yes_listed and self.no_listed

    @property
    def bound(self) -> Literal["exact", "upper", "lower", "none"]:
        """What ``score`` is: the log-odds (``exact``), a bound on it from above (``upper``: no
        yes variant listed) or below (``lower``: no no variant listed), or meaningless
        (``none``: neither side listed; the judge did not answer yes or no)."""
        if self.exact:
            return "exact"
        if self.no_listed:
            return "upper"
        return "lower" if self.yes_listed else "none"


def _logsumexp(values: Sequence[float]) -> float:
    peak = max(values)
    return peak + math.log(sum(math.exp(v - peak) for v in values))


def _side_logprob(listed: dict[str, list[float]], variants: Sequence[str], floor: float) -> tuple[float, bool]:
    """(log Σ p over the side's listed variants, True), or (its upper bound, False) if none is listed."""
    found = [lp for v in variants for lp in listed.get(v, [])]
    if found:
        return _logsumexp(found), True
    # Every unlisted token has p ≤ p_K, so the m variants together have at most m · p_K.
    return floor + math.log(len(variants)), False


def _first_top_logprobs(reply: dict[str, Any], url: str) -> list[dict[str, Any]]:
    try:
        top = reply["choices"][0]["logprobs"]["content"][0]["top_logprobs"]
    except (KeyError, IndexError, TypeError):
        raise JudgeError(
            f"judge at {url} answered without top_logprobs for its first token: {json.dumps(reply)[:300]}"
        ) from None
    if not top:
        raise JudgeError(f"judge at {url} listed no top_logprobs for its first token")
    return top


def judge_yes_no(
    address: str,
    messages: Sequence[dict[str, Any]],
    *,
    yes: Sequence[str] = YES,
    no: Sequence[str] = NO,
    top_logprobs: int = DEFAULT_TOP_LOGPROBS,
    model: str | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    api_key: str | None = None,
) -> Verdict:
    """The judge's yes/no log-odds on ``messages``, from one greedy one-token request.

    Sends ``max_tokens=1, temperature=0, logprobs=true, top_logprobs=K`` and reads the first
    token's K alternatives (``lp_1 ≥ … ≥ lp_K``). A variant is matched by the listed token's
    exact text, so list the spellings the judge's tokenizer has as single tokens (with and
    without a leading space, capitalised or not: the defaults :data:`YES` / :data:`NO`).

        yes_logprob = log Σ_{t ∈ yes, listed} exp(lp_t)      (no_logprob likewise)
        score       = yes_logprob − no_logprob

    **Top-K bound.** The server lists only K tokens. A variant missing from the list has
    ``lp ≤ lp_K``; when *no* variant of a side is listed, that side's log-prob is replaced by
    its upper bound ``lp_K + log m`` (m = its number of variants), and the score becomes a
    bound: an upper bound when yes is missing, a lower bound when no is missing
    (:attr:`Verdict.bound`; :attr:`Verdict.exact` is false). When some variants of a side are
    listed, the unlisted ones (each below ``p_K``) are left out. Neither side listed: the judge
    did not answer yes or no (``bound == "none"``); the score is then meaningless.
    """
    yes, no = _checked_variants(yes, no, top_logprobs)
    reply = chat_completion(
        address,
        messages,
        model=model,
        timeout_s=timeout_s,
        api_key=api_key,
        max_tokens=1,
        temperature=0,
        logprobs=True,
        top_logprobs=top_logprobs,
    )
    top = _first_top_logprobs(reply, base_url(address) + "/v1/chat/completions")
    return _verdict_from_top(top, yes, no)


def _checked_variants(
    yes: Sequence[str], no: Sequence[str], top_logprobs: int
) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The yes / no spellings with repeats dropped (a repeated spelling counts once); raises
    before any request when they cannot give a meaningful score."""
    if not yes or not no:
        raise ValueError("give at least one yes variant and one no variant")
    if set(yes) & set(no):
        raise ValueError(f"{sorted(set(yes) & set(no))} are listed as both yes and no")
    if top_logprobs < 1:
        raise ValueError(f"top_logprobs must be >= 1, got {top_logprobs}")
    return tuple(dict.fromkeys(yes)), tuple(dict.fromkeys(no))


def _verdict_from_top(top: list[dict[str, Any]], yes: Sequence[str], no: Sequence[str]) -> Verdict:
    """The :class:`Verdict` of a first token's listed alternatives (see :func:`judge_yes_no`)."""
    # Two ids can decode to the same text (e.g. byte pieces of one character); both count.
    listed: dict[str, list[float]] = {}
    for entry in top:
        listed.setdefault(str(entry["token"]), []).append(float(entry["logprob"]))
    floor = min(float(entry["logprob"]) for entry in top)
    yes_lp, yes_listed = _side_logprob(listed, yes, floor)
    no_lp, no_listed = _side_logprob(listed, no, floor)
    best = max(top, key=lambda entry: float(entry["logprob"]))
    return Verdict(yes_lp - no_lp, yes_lp, no_lp, yes_listed, no_listed, str(best["token"]))


def yes_no_logit(
    address: str,
    messages: Sequence[dict[str, Any]],
    *,
    yes: Sequence[str] = YES,
    no: Sequence[str] = NO,
    top_logprobs: int = DEFAULT_TOP_LOGPROBS,
    model: str | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    api_key: str | None = None,
) -> float:
    """``log p(yes) − log p(no)`` of the judge's first token (:func:`judge_yes_no`'s score;
    a bound when one side is not in the top K). Raises :class:`JudgeError` when neither side
    is listed, since no number would be meaningful then."""
    verdict = judge_yes_no(
        address, messages, yes=yes, no=no, top_logprobs=top_logprobs, model=model, timeout_s=timeout_s, api_key=api_key
    )
    if verdict.bound == "none":
        raise JudgeError(
            f"the judge answered neither yes nor no: none of {list(yes)} or {list(no)} is among its top "
            f"{top_logprobs} first tokens (most likely: {verdict.top_token!r})"
        )
    return verdict.score


__all__ = [
    "JudgeError",
    "Verdict",
    "base_url",
    "chat_completion",
    "judge_yes_no",
    "render_judge_messages",
    "served_model",
    "yes_no_logit",
]
