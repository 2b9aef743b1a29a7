"""Generative judge over HTTP against the project's server on loopback (tiny llama, fp32).

The identity: the judge's ``log p(yes) − log p(no)`` at the first answer token equals a
sequence-classification reward model on the same decoder whose 1×H head is
``W[yes] − W[no]`` of the LM head, read at the prompt's last token — the softmax normaliser
cancels. Also: the top-K bound when a side is not listed, errors that name the address and
pass the server's message through, and the example reward file.
"""

from __future__ import annotations

import copy
import http.server
import math
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from transformers import LlamaForSequenceClassification

from hybridflow.inference.generation_engine import GenerationEngine
from hybridflow.models.reward_model import last_token_scores
from hybridflow.models.tiny import build_tiny_model
from hybridflow.reward.custom import load_custom_reward_function
from hybridflow.reward.judge import (
    API_KEY_ENV,
    JudgeError,
    chat_completion,
    judge_yes_no,
    render_judge_messages,
    yes_no_logit,
)
from tests.serving import free_port, serve_in_thread

pytestmark = pytest.mark.usefixtures("one_torch_thread")
ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "judge_reward.py"
API_KEY = "judge-key"
TIMEOUT_S = 60
TOP_K = 20
QUESTION, RESPONSE, REFERENCE = "What is 2 + 3?", "2 + 3 = 5. #### 5", "5"
MESSAGES = render_judge_messages(QUESTION, RESPONSE, reference=REFERENCE)


@pytest.fixture(autouse=True)
def _api_key(monkeypatch: pytest.MonkeyPatch) -> None:
    # The judge client's default key, as a trainer-started server and its scorers would share it.
    monkeypatch.setenv(API_KEY_ENV, API_KEY)


@pytest.fixture(scope="module")
def judge(tokenizer) -> Iterator[tuple[str, object]]:
    """The tiny llama (fp32, seed 0) served in this process: (``"host:port"``, the server's codec)."""
    pytest.importorskip("fastapi")
    from hybridflow.server.app import build_app
    from hybridflow.server.state import ServerState
    from hybridflow.server.text import TextCodec

    engine = GenerationEngine(build_tiny_model(tokenizer, seed=0, dtype=torch.float32), tokenizer.pad_token_id)
    state = ServerState(engine=engine, codec=TextCodec(tokenizer), model_name="tiny-judge", max_model_len=1024,
                        eos_token_ids=(tokenizer.eos_token_id,), api_key=API_KEY)
    with serve_in_thread(build_app(state)) as url:
        yield url.removeprefix("http://"), state.codec


@dataclass(frozen=True)
class Reference:
    """The same model run here on the chat-template ids: words picked from its top K."""

    lm: torch.nn.Module
    input_ids: list[int]
    logprobs: torch.Tensor  # (V,) log softmax at the last prompt position
    yes_id: int
    no_id: int
    yes: str
    no: str
    missing: tuple[str, str]  # two token texts outside the top K (and unlike any listed text)
    lowest_listed: float  # lp_K
    texts: tuple[str, ...]  # each token id's text, as the server lists it

    def logprob_of(self, text: str) -> float:
        """log Σ p over the tokens whose text is ``text`` (the true value behind a bound)."""
        ids = [i for i, t in enumerate(self.texts) if t == text]
        return float(torch.logsumexp(self.logprobs[ids], 0))


@pytest.fixture(scope="module")
def reference(tokenizer) -> Reference:
    lm = build_tiny_model(tokenizer, seed=0, dtype=torch.float32)
    ids = tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=True,
                                        return_dict=True)["input_ids"]
    with torch.no_grad():
        logprobs = lm(torch.tensor([ids])).logits[0, -1].float().log_softmax(-1)
    order = logprobs.argsort(descending=True).tolist()
    text = tuple(tokenizer.decode([i], skip_special_tokens=False) for i in range(len(logprobs)))
    listed = [text[i] for i in order[:TOP_K]]
    # A word stands for one token only if no other listed token decodes to the same text.
    unique = [i for i in order[:TOP_K] if listed.count(text[i]) == 1]
    outside = [text[i] for i in reversed(order[TOP_K:]) if text[i] not in listed and text[i].strip()]
    yes_id, no_id = unique[1], unique[-2]  # not the top token: the verdict is not about the argmax
    return Reference(lm, ids, logprobs, yes_id, no_id, text[yes_id], text[no_id],
                     (outside[0], outside[1]), float(logprobs[order[TOP_K - 1]]), text)


def _classifier_with_yes_minus_no_head(lm: torch.nn.Module, yes_id: int, no_id: int) -> torch.nn.Module:
    """A 1-output sequence classifier on ``lm``'s decoder with head ``W[yes] − W[no]`` (1×H)."""
    config = copy.deepcopy(lm.config)
    config.num_labels = 1
    rm = LlamaForSequenceClassification(config).to(torch.float32).eval()
    rm.model.load_state_dict(lm.model.state_dict())
    with torch.no_grad():
        weight = lm.lm_head.weight
        rm.score.weight.copy_((weight[yes_id] - weight[no_id]).unsqueeze(0))
    return rm


# ---- the identity -------------------------------------------------------------------------------


def test_server_renders_the_prompt_as_apply_chat_template(judge, reference):
    address, codec = judge
    assert codec.chat_prompt_ids(MESSAGES) == reference.input_ids
    reply = chat_completion(address, MESSAGES, max_tokens=1, temperature=0)
    assert reply["usage"]["prompt_tokens"] == len(reference.input_ids)


def test_judge_log_odds_equal_a_classifier_with_head_w_yes_minus_w_no(judge, reference):
    address, _ = judge
    verdict = judge_yes_no(address, MESSAGES, yes=(reference.yes,), no=(reference.no,), top_logprobs=TOP_K)
    assert verdict.exact and verdict.bound == "exact"
    assert verdict.yes_logprob == pytest.approx(float(reference.logprobs[reference.yes_id]), abs=1e-4)
    assert verdict.no_logprob == pytest.approx(float(reference.logprobs[reference.no_id]), abs=1e-4)

    rm = _classifier_with_yes_minus_no_head(reference.lm, reference.yes_id, reference.no_id)
    ids = torch.tensor([reference.input_ids])
    with torch.no_grad():
        head_score = float(last_token_scores(rm, ids, torch.ones_like(ids))[0])
    assert verdict.score == pytest.approx(head_score, abs=1e-4)
    logit = yes_no_logit(address, MESSAGES, yes=(reference.yes,), no=(reference.no,))
    assert logit == pytest.approx(head_score, abs=1e-4)


def test_several_variants_of_a_side_add_their_probabilities(judge, reference):
    address, _ = judge
    verdict = judge_yes_no(address, MESSAGES, yes=(reference.yes, reference.missing[0]), no=(reference.no,))
    assert verdict.exact  # one listed variant per side; the unlisted one (p < p_K) is left out
    assert verdict.yes_logprob == pytest.approx(float(reference.logprobs[reference.yes_id]), abs=1e-4)
    both = judge_yes_no(address, MESSAGES, yes=(reference.yes, reference.no), no=(reference.missing[0],))
    expected = torch.logsumexp(reference.logprobs[[reference.yes_id, reference.no_id]], 0)
    assert both.yes_logprob == pytest.approx(float(expected), abs=1e-4)


# ---- the top-K bound ----------------------------------------------------------------------------


def test_a_missing_no_gives_a_lower_bound(judge, reference):
    address, _ = judge
    missing = reference.missing[0]
    verdict = judge_yes_no(address, MESSAGES, yes=(reference.yes,), no=(missing,))
    assert not verdict.exact and verdict.bound == "lower" and not verdict.no_listed
    assert verdict.no_logprob == pytest.approx(reference.lowest_listed, abs=1e-4)
    true_score = float(reference.logprobs[reference.yes_id]) - reference.logprob_of(missing)
    assert verdict.score <= true_score + 1e-5


def test_a_missing_yes_gives_an_upper_bound(judge, reference):
    address, _ = judge
    missing = reference.missing[0]
    verdict = judge_yes_no(address, MESSAGES, yes=(missing,), no=(reference.no,))
    assert verdict.bound == "upper" and not verdict.yes_listed and verdict.no_listed
    true_score = reference.logprob_of(missing) - float(reference.logprobs[reference.no_id])
    assert verdict.score >= true_score - 1e-5
    assert yes_no_logit(address, MESSAGES, yes=(missing,), no=(reference.no,)) == pytest.approx(verdict.score)


def test_the_bound_of_a_missing_side_counts_its_variants(judge, reference):
    address, _ = judge
    verdict = judge_yes_no(address, MESSAGES, yes=(reference.yes,), no=reference.missing)
    assert verdict.no_logprob == pytest.approx(reference.lowest_listed + math.log(2), abs=1e-4)


def test_neither_side_listed_is_no_verdict(judge, reference):
    address, _ = judge
    verdict = judge_yes_no(address, MESSAGES, yes=(reference.missing[0],), no=(reference.missing[1],))
    assert verdict.bound == "none" and not verdict.exact
    with pytest.raises(JudgeError, match="neither yes nor no"):
        yes_no_logit(address, MESSAGES, yes=(reference.missing[0],), no=(reference.missing[1],))


# ---- errors -------------------------------------------------------------------------------------


def test_connection_refused_names_the_address():
    address = f"127.0.0.1:{free_port()}"  # nothing listens there
    with pytest.raises(JudgeError, match=rf"cannot reach the judge at http://{address}/v1/models"):
        judge_yes_no(address, MESSAGES)
    with pytest.raises(JudgeError, match=rf"http://{address}/v1/chat/completions.*reward_model.enable=true"):
        chat_completion(f"http://{address}/v1/", MESSAGES, model="m", max_tokens=1)


def test_server_errors_pass_the_message_through(judge):
    address, _ = judge
    with pytest.raises(JudgeError, match=r"HTTP 400: model 'other' is not served here"):
        judge_yes_no(address, MESSAGES, model="other")
    with pytest.raises(JudgeError, match=r"HTTP 400: top_logprobs: .*less than or equal to 20"):
        judge_yes_no(address, MESSAGES, top_logprobs=21)
    with pytest.raises(JudgeError, match=r"HTTP 401"):
        chat_completion(address, MESSAGES, model="tiny-judge", api_key="wrong", max_tokens=1)


def test_a_non_json_error_page_is_shown():
    class BadGateway(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - the handler's API
            self.send_response(502)
            self.send_header("Content-Type", "text/html")
            self.end_headers()
            self.wfile.write(b"<html>upstream is down</html>")

        def log_message(self, *args: object) -> None:
            pass

    proxy = http.server.HTTPServer(("127.0.0.1", 0), BadGateway)
    thread = threading.Thread(target=proxy.serve_forever, daemon=True)
    thread.start()
    try:
        with pytest.raises(JudgeError, match=r"HTTP 502: <html>upstream is down</html>"):
            judge_yes_no(f"127.0.0.1:{proxy.server_port}", MESSAGES)
    finally:
        proxy.shutdown()
        thread.join(TIMEOUT_S)


def test_a_silent_server_times_out():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:  # accepts connections, never answers
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        address = f"127.0.0.1:{sock.getsockname()[1]}"
        with pytest.raises(JudgeError, match=rf"judge at http://{address}/v1/chat/completions did not answer "
                                             r"within 0.2 s"):
            judge_yes_no(address, MESSAGES, model="m", timeout_s=0.2)


def test_render_judge_messages():
    assert render_judge_messages("Q?", "A.") == [
        {"role": "user", "content": "Question: Q?\n\nAnswer: A.\n\nIs this answer correct? Answer yes or no."}
    ]
    assert "Reference answer: 5" in MESSAGES[0]["content"]
    assert render_judge_messages("Q?", "A {x}", template="{response}|{question}")[0]["content"] == "A {x}|Q?"


# ---- the example reward file -------------------------------------------------------------------


def test_example_reward_scores_with_the_judge(judge, reference):
    address, _ = judge
    compute_score = load_custom_reward_function(EXAMPLE)
    extra_info = {"split": "test", "index": 0, "expression": "2 + 3", "answer": "5"}  # the arithmetic task's
    result = compute_score("hybridflow/arithmetic", RESPONSE, "5", extra_info, reward_router_address=address,
                           reward_model_tokenizer=None, yes=(reference.yes,), no=(reference.no,))
    assert isinstance(result["score"], float) and 0.0 < result["score"] < 1.0
    expected = judge_yes_no(address, MESSAGES, yes=(reference.yes,), no=(reference.no,)).score
    assert result["judge_logit"] == pytest.approx(expected, abs=1e-6)
    assert result["score"] == pytest.approx(1 / (1 + math.exp(-expected)))
    assert result["judge_exact"] == 1.0


def test_example_reward_errors_clearly(judge, reference):
    compute_score = load_custom_reward_function(EXAMPLE)
    with pytest.raises(ValueError, match=r"reward_model.enable=true and reward_model.model.path"):
        compute_score("hybridflow/arithmetic", RESPONSE, "5", {"expression": "2 + 3"})
    with pytest.raises(ValueError, match=r"no 'question'"):
        compute_score("my/source", RESPONSE, "5", {"index": 0}, reward_router_address=judge[0])
    with pytest.raises(JudgeError, match="neither yes nor no"):
        compute_score("my/source", RESPONSE, "5", {"question": QUESTION}, reward_router_address=judge[0],
                      yes=(reference.missing[0],), no=(reference.missing[1],))
