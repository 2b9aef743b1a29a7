"""The continuous batcher: joining a running batch, limits, stop rules, compaction, seeds.

Most tests use a scripted decoder whose next token depends only on (last token, position),
so the expected output of every request is known in closed form, whatever else shares its
batch and however often it was re-prefilled. The last tests run the tiny Llama for real.
"""

from __future__ import annotations

import pytest
import torch

from hybridflow.inference.batcher_types import GenRequest
from hybridflow.inference.continuous import ContinuousBatcher
from hybridflow.inference.decoders import build_decoder
from hybridflow.inference.generation import generate
from hybridflow.inference.sampling import GenerationParams, NonFiniteLogitsError
from hybridflow.models.tiny import build_tiny_model, build_tiny_tokenizer

PAD, VOCAB = 0, 32


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def chain(token: int, position: int) -> int:
    """The scripted model: next token after ``token`` fed at ``position``."""
    return 2 + (3 * token + position) % 29


def expected(prompt: list[int], steps: int) -> list[int]:
    tokens, token, position = [], prompt[-1], len(prompt) - 1
    for _ in range(steps):
        token = chain(token, position)
        tokens.append(token)
        position += 1
    return tokens


class ChainDecoder:
    """Decoder protocol over :func:`chain`; records calls and enforces the cache size."""

    def __init__(self) -> None:
        self.state = torch.empty(0, 2, dtype=torch.long)  # per cache row: (last token, its position)
        self.prefills: list[tuple[int, int, int]] = []  # (rows, width, max_len)
        self.decodes: list[int] = []
        self.selects: list[list[int]] = []
        self.length = self.max_len = 0

    def _logits(self) -> torch.Tensor:
        nxt = [chain(int(t), int(p)) for t, p in self.state]
        logits = torch.zeros(len(nxt), VOCAB)
        logits[torch.arange(len(nxt)), torch.tensor(nxt, dtype=torch.long)] = 10.0
        return logits

    def prefill(self, input_ids, attention_mask, position_ids, max_len):
        assert bool(attention_mask[:, -1].all()), "prompts must be left-padded"
        assert torch.equal(position_ids, (attention_mask.cumsum(1) - 1).clamp(min=0))
        self.prefills.append((input_ids.shape[0], input_ids.shape[1], max_len))
        self.length, self.max_len = input_ids.shape[1], max_len
        self.state = torch.stack([input_ids[:, -1], position_ids[:, -1]], dim=1)
        return self._logits()

    def decode(self, tokens, positions):
        assert tokens.shape[0] == self.state.shape[0]
        assert self.length < self.max_len, "KV cache full"
        self.length += 1
        self.decodes.append(tokens.shape[0])
        self.state = torch.stack([tokens, positions], dim=1)
        return self._logits()

    def select_rows(self, index):
        self.selects.append(index.tolist())
        self.state = self.state[index]

    def refresh_weights(self):
        return 0

    def invalidate_weights(self):
        pass

    def release(self):
        self.state = torch.empty(0, 2, dtype=torch.long)


def greedy(max_new: int, n: int = 1, stops: tuple[int, ...] = (), ignore_eos: bool = False) -> GenerationParams:
    return GenerationParams(max_new_tokens=max_new, do_sample=False, n=n, stop_token_ids=stops, ignore_eos=ignore_eos)


def run_all(batcher: ContinuousBatcher, arrivals: dict[int, list[GenRequest]], max_steps: int = 100) -> dict:
    """Step until idle; ``arrivals[s]`` are submitted before step s. Returns handle → outputs."""
    results, order = {}, []
    for step in range(max_steps):
        for request in arrivals.get(step, []):
            order.append(batcher.submit(request))
        for handle, outputs in batcher.step():
            results[handle] = outputs
        if batcher.idle and step >= max(arrivals):
            break
    return {h: results[h] for h in order}


def test_single_request_is_one_prefill_then_one_decode_per_token():
    decoder = ChainDecoder()
    batcher = ContinuousBatcher(decoder, PAD)
    (outputs,) = run_all(batcher, {0: [GenRequest((5, 7, 9), greedy(6))]}).values()
    assert outputs[0].token_ids == expected([5, 7, 9], 6)
    assert outputs[0].finish_reason == "length"
    assert decoder.prefills == [(1, 3, 3 + 6 - 1)]
    assert decoder.decodes == [1] * 5
    assert batcher.stats.forwards == 6 and batcher.stats.tokens_generated == 6


def test_a_request_joins_a_running_batch_at_the_next_step():
    decoder = ChainDecoder()
    batcher = ContinuousBatcher(decoder, PAD)
    a, b = GenRequest((4, 11), greedy(8)), GenRequest((6, 2, 3, 8, 1), greedy(4))
    out_a, out_b = run_all(batcher, {0: [a], 3: [b]}).values()
    assert out_a[0].token_ids == expected([4, 11], 8)
    assert out_b[0].token_ids == expected([6, 2, 3, 8, 1], 4)
    # Step 3 re-prefills a's prompt + its 3 tokens (5) beside b's prompt (5): width 5, and
    # the cache must hold a's remaining 5 tokens or b's 4: 5 + 5 − 1 columns.
    assert decoder.prefills == [(1, 2, 9), (2, 5, 9)]
    assert batcher.stats.joins == 1
    # a alone for 3 forwards, a and b together for 4 (b's 4 tokens), a alone for its last one
    assert batcher.stats.forward_requests == {1: 4, 2: 4}
    assert decoder.decodes == [1, 1, 2, 2, 2, 1]


def test_stop_tokens_end_a_response_unless_ignore_eos():
    prompt = (3, 4)
    full = expected(list(prompt), 6)
    stop = full[2]
    first_stop = full.index(stop)
    batcher = ContinuousBatcher(ChainDecoder(), PAD)
    requests = [
        GenRequest(prompt, greedy(6, stops=(stop,))),
        GenRequest(prompt, greedy(6, stops=(stop,), ignore_eos=True)),
    ]
    stopped, ignored = run_all(batcher, {0: requests}).values()
    assert stopped[0].token_ids == full[: first_stop + 1]  # the stop token is kept
    assert stopped[0].finish_reason == "stop"
    assert ignored[0].token_ids == full and ignored[0].finish_reason == "length"


def test_stop_check_sees_the_response_so_far():
    seen: list[list[int]] = []

    def check(ids):
        seen.append(list(ids))
        return len(ids) == 2

    batcher = ContinuousBatcher(ChainDecoder(), PAD)
    (out,) = run_all(batcher, {0: [GenRequest((9,), greedy(5), stop_check=check)]}).values()
    assert out[0].token_ids == expected([9], 2) and out[0].finish_reason == "stop"
    assert seen == [expected([9], 1), expected([9], 2)]


def test_n_samples_share_one_prefill_row():
    decoder = ChainDecoder()
    batcher = ContinuousBatcher(decoder, PAD)
    (outputs,) = run_all(batcher, {0: [GenRequest((7, 8), greedy(3, n=3))]}).values()
    assert [o.token_ids for o in outputs] == [expected([7, 8], 3)] * 3
    assert decoder.prefills[0][0] == 1 and decoder.selects[0] == [0, 0, 0]


def test_finished_rows_leave_the_cache_once_a_quarter_is_done():
    decoder = ChainDecoder()
    batcher = ContinuousBatcher(decoder, PAD)
    requests = [GenRequest((p,), greedy(m)) for p, m in ((5, 1), (6, 4), (7, 4), (8, 4))]
    results = run_all(batcher, {0: requests})
    assert [r[0].token_ids for r in results.values()] == [expected([p], m) for p, m in ((5, 1), (6, 4), (7, 4), (8, 4))]
    assert decoder.selects == [[1, 2, 3]]  # 1 of 4 finished after the first token
    assert decoder.decodes == [3, 3, 3]


def test_max_rows_holds_requests_back_until_there_is_room():
    decoder = ChainDecoder()
    batcher = ContinuousBatcher(decoder, PAD, max_rows=2)
    requests = [GenRequest((4,), greedy(2)), GenRequest((5,), greedy(5)), GenRequest((6,), greedy(2))]
    results = run_all(batcher, {0: requests})
    assert [r[0].token_ids for r in results.values()] == [expected([4], 2), expected([5], 5), expected([6], 2)]
    assert max(batcher.stats.forward_rows) == 2
    assert decoder.prefills[1][0] == 2  # the third request joined once the first was done
    with pytest.raises(ValueError, match="n=3 exceeds the batch limit of 2 rows"):
        batcher.submit(GenRequest((4,), greedy(2, n=3)))


def finish_steps(batcher: ContinuousBatcher, arrivals: dict[int, list[GenRequest]], max_steps: int = 100) -> list[int]:
    """The step at which each request finished, in submission order (``arrivals`` as in run_all)."""
    done, order = {}, []
    for step in range(max_steps):
        order += [batcher.submit(request) for request in arrivals.get(step, [])]
        done.update((handle, step) for handle, _ in batcher.step())
        if batcher.idle and step >= max(arrivals):
            break
    return [done[h] for h in order]


def test_a_call_that_arrives_later_gets_rows_before_the_running_calls_next_requests():
    """Four 6-token requests of one call (group 1) on 4 rows with a cap of 2 per call: two run,
    two wait. A 2-token request of another call arriving at step 2 joins at once and is done at
    step 3; the first call's other two start when its first two end (step 6)."""
    batcher = ContinuousBatcher(ChainDecoder(), PAD, max_rows=4, max_rows_per_group=2)
    big = [GenRequest((4 + i,), greedy(6), group=1) for i in range(4)]
    steps = finish_steps(batcher, {0: big, 2: [GenRequest((9,), greedy(2), group=2)]})
    assert steps == [5, 5, 11, 11, 3]
    # Without groups and caps admission is first come, first served: the late one waits.
    fifo = ContinuousBatcher(ChainDecoder(), PAD, max_rows=4)
    ungrouped = [GenRequest((4 + i,), greedy(6)) for i in range(4)]
    assert finish_steps(fifo, {0: ungrouped, 2: [GenRequest((9,), greedy(2))]}) == [5, 5, 5, 5, 7]


def test_a_smaller_request_does_not_overtake_the_one_whose_turn_it_is():
    """Call C (n=3) is next but does not fit beside the running call; call D (n=1), which
    came after it, would fit and still waits: both start when the rows are free (no
    starvation of large requests)."""
    batcher = ContinuousBatcher(ChainDecoder(), PAD, max_rows=4)
    running = GenRequest((4,), greedy(5, n=2), group=1)
    c, d = GenRequest((5,), greedy(2, n=3), group=2), GenRequest((6,), greedy(2), group=3)
    assert finish_steps(batcher, {0: [running], 1: [c, d]}) == [4, 6, 6]
    with pytest.raises(ValueError, match="max_rows_per_group must be >= 1"):
        ContinuousBatcher(ChainDecoder(), PAD, max_rows_per_group=0)


def test_abort_running_forgets_admitted_requests_and_keeps_the_queue():
    batcher = ContinuousBatcher(ChainDecoder(), PAD)
    first = batcher.submit(GenRequest((4,), greedy(5)))
    batcher.step()
    second = batcher.submit(GenRequest((5,), greedy(2)))
    assert batcher.num_running == 1 and batcher.num_waiting == 1
    assert batcher.abort_running() == [first]
    assert batcher.num_running == 0 and batcher.num_waiting == 1
    finished = [handle for _ in range(5) for handle, _ in batcher.step()]
    assert finished == [second] and batcher.idle  # the queued request ran after the abort


def test_bad_requests_are_refused():
    with pytest.raises(ValueError, match="prompt_ids is empty"):
        GenRequest((), greedy(2))
    with pytest.raises(ValueError, match="top_logprobs must be >= 0"):
        GenRequest((1,), greedy(2), top_logprobs=-1)
    with pytest.raises(ValueError, match="max_rows must be >= 1"):
        ContinuousBatcher(ChainDecoder(), PAD, max_rows=0)
    with pytest.raises(ValueError, match=r"seed must be in \[-2\*\*63, 2\*\*64 - 1\]"):
        GenRequest((1,), greedy(2), seed=2**64)


# ---- one request's failure is its own ----------------------------------------------------------

POISON = 31  # chain() never produces it, so only a prompt can end with it


class PoisonDecoder(ChainDecoder):
    """Like ChainDecoder, but a row whose last token is POISON gets NaN logits (a broken row)."""

    def _logits(self) -> torch.Tensor:
        logits = super()._logits()
        logits[self.state[:, 0] == POISON] = float("nan")
        return logits


@pytest.mark.parametrize(
    "params", [greedy(4), GenerationParams(max_new_tokens=4, temperature=1.0)], ids=["greedy", "sampled"]
)
def test_non_finite_logits_fail_only_the_request_they_belong_to(params):
    # Same settings and the batcher's shared generator: the three rows are sampled as one group.
    batcher = ContinuousBatcher(PoisonDecoder(), PAD, generator=torch.Generator().manual_seed(0))
    before, broken, after = run_all(
        batcher, {0: [GenRequest((5,), params), GenRequest((POISON,), params), GenRequest((6, 7), params)]}
    ).values()
    assert isinstance(broken, NonFiniteLogitsError)
    assert "non-finite logits" in str(broken) and "the model is broken" in str(broken)
    assert [len(before[0].token_ids), len(after[0].token_ids)] == [4, 4]
    if params.greedy:
        assert before[0].token_ids == expected([5], 4) and after[0].token_ids == expected([6, 7], 4)
    assert batcher.stats.requests_failed == 1 and batcher.stats.requests_finished == 2 and batcher.idle


def test_a_stop_check_that_raises_fails_only_its_request():
    def explode(ids):
        raise RuntimeError("boom")

    batcher = ContinuousBatcher(ChainDecoder(), PAD)
    failed, fine = run_all(
        batcher, {0: [GenRequest((4,), greedy(5, n=2), stop_check=explode), GenRequest((5,), greedy(5))]}
    ).values()
    assert isinstance(failed, RuntimeError) and str(failed) == "boom"
    assert fine[0].token_ids == expected([5], 5)
    assert batcher.stats.requests_failed == 1


def test_cancel_drops_waiting_and_running_requests():
    decoder = ChainDecoder()
    batcher = ContinuousBatcher(decoder, PAD)
    running = batcher.submit(GenRequest((4,), greedy(20)))
    kept = batcher.submit(GenRequest((5,), greedy(6)))
    batcher.step()
    batcher.step()
    waiting = batcher.submit(GenRequest((6,), greedy(3)))
    assert batcher.cancel(waiting) and batcher.cancel(running)
    assert not batcher.cancel(running) and not batcher.cancel(999)
    results = {}
    for _ in range(10):
        results.update(dict(batcher.step()))
    assert list(results) == [kept] and results[kept][0].token_ids == expected([5], 6)
    # the cancelled row was never sampled again and left the cache at the next step
    assert decoder.selects == [[1]] and batcher.stats.tokens_generated == 2 * 2 + 4
    assert batcher.stats.requests_cancelled == 2 and batcher.idle


# ---- the tiny Llama ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny():
    """Tiny Llama, its tokenizer, and one decoder over it (reused: packing weights is the slow part)."""
    tokenizer = build_tiny_tokenizer()
    model = build_tiny_model(tokenizer)
    return model, tokenizer, build_decoder(model)


def _ids(tokenizer, text: str) -> tuple[int, ...]:
    return tuple(tokenizer(text)["input_ids"])


def _alone(decoder, prompt: tuple[int, ...], params: GenerationParams) -> list[int]:
    ids = torch.tensor([prompt])
    mask = torch.ones_like(ids)
    out = generate(decoder, ids, mask, mask.cumsum(1) - 1, params, PAD)
    return out.responses[0, : out.lengths[0]].tolist()


def test_joined_greedy_output_equals_the_sampler_run_alone(tiny):
    _, tokenizer, decoder = tiny
    params = greedy(12, stops=(tokenizer.eos_token_id,))
    prompts = [_ids(tokenizer, t) for t in ("What is 7 + 5?", "Hi", "The quick brown fox jumps over")]
    batcher = ContinuousBatcher(decoder, tokenizer.pad_token_id)
    results = run_all(
        batcher,
        {0: [GenRequest(prompts[0], params)], 2: [GenRequest(prompts[1], params)], 5: [GenRequest(prompts[2], params)]},
    )
    assert [r[0].token_ids for r in results.values()] == [_alone(decoder, p, params) for p in prompts]
    assert batcher.stats.joins == 2 and max(batcher.stats.forward_requests) == 3


def test_a_seeded_request_samples_the_same_with_or_without_company(tiny):
    _, tokenizer, decoder = tiny
    sampled = GenerationParams(max_new_tokens=10, temperature=1.0, top_k=50)
    request = GenRequest(_ids(tokenizer, "Hi"), sampled, seed=123)
    alone = run_all(ContinuousBatcher(decoder, tokenizer.pad_token_id), {0: [request]})
    crowd = [GenRequest(_ids(tokenizer, "What is 7 + 5?"), sampled), request, GenRequest(_ids(tokenizer, "x"), sampled)]
    together = run_all(ContinuousBatcher(decoder, tokenizer.pad_token_id), {0: crowd[:1], 1: crowd[1:]})
    assert list(together.values())[1][0].token_ids == list(alone.values())[0][0].token_ids


def test_top_logprobs_list_the_greedy_token_first_with_its_logprob(tiny):
    _, tokenizer, decoder = tiny
    batcher = ContinuousBatcher(decoder, tokenizer.pad_token_id)
    (out,) = run_all(batcher, {0: [GenRequest(_ids(tokenizer, "Hi"), greedy(4), top_logprobs=3)]}).values()
    for token, logprob, top in zip(out[0].token_ids, out[0].logprobs, out[0].top_logprobs, strict=True):
        assert len(top) == 3 and top[0] == (token, logprob)
        assert top[0][1] >= top[1][1] >= top[2][1]


def test_joins_splice_the_cache_without_recomputing_running_rows(tiny):
    """A 2-sample request joins while 4 rows decode and a finished row still sits in the cache
    (it stays until compaction): the running rows are not re-run (no recomputed tokens), every
    row's greedy tokens are the sampler's alone, and the log-probs agree with the lone runs to
    float rounding."""
    model, tokenizer, decoder = tiny
    long, short, late = (_ids(tokenizer, t) for t in ("The quick brown fox jumps over", "Hi", "What is 7 + 5?"))
    batcher = ContinuousBatcher(decoder, tokenizer.pad_token_id)
    results = run_all(
        batcher,
        {0: [GenRequest(long, greedy(12, n=4)), GenRequest(short, greedy(2))], 4: [GenRequest(late, greedy(9, n=2))]},
    )
    outs = list(results.values())
    assert batcher.stats.joins == 1 and batcher.stats.recomputed_tokens == 0
    # 5 rows until the join, then 2 more: the short request's finished row stays (1/7 < 1/4)
    assert batcher.stats.forward_rows[5] == 4 and max(batcher.stats.forward_rows) == 7
    for prompt, max_new, rows in ((long, 12, outs[0]), (short, 2, outs[1]), (late, 9, outs[2])):
        ids = torch.tensor([prompt])
        mask = torch.ones_like(ids)
        alone = generate(decoder, ids, mask, mask.cumsum(1) - 1, greedy(max_new), PAD)
        expected = alone.responses[0, : alone.lengths[0]].tolist()
        for row in rows:
            assert row.token_ids == expected
            assert torch.allclose(torch.tensor(row.logprobs), alone.log_probs[0, : alone.lengths[0]], atol=1e-5)


def test_a_decoder_without_join_recomputes_the_running_rows(tiny):
    model, tokenizer, _ = tiny
    hf = build_decoder(model, decoder="hf")
    params = greedy(8)
    prompts = [_ids(tokenizer, t) for t in ("What is 7 + 5?", "Hi")]
    batcher = ContinuousBatcher(hf, tokenizer.pad_token_id)
    results = run_all(batcher, {0: [GenRequest(prompts[0], params)], 3: [GenRequest(prompts[1], params)]})
    assert [r[0].token_ids for r in results.values()] == [_alone(hf, p, params) for p in prompts]
    # the running row had its prompt and 3 tokens when the second request joined
    assert batcher.stats.joins == 1 and batcher.stats.recomputed_tokens == len(prompts[0]) + 3


SYSTEM = "You are a careful assistant. Answer briefly and show the arithmetic you did step by step. "


@pytest.mark.parametrize(("weights", "together"), [("packed", False), ("shared", False), ("packed", True)])
def test_a_joining_prompt_reuses_the_prefix_a_cache_row_already_ran(weights, together):
    """Two requests share a long system prompt; a third continues the first one's finished
    conversation (an agent's next turn) while 4 other rows decode. Each joining request copies
    its prefix from a cache row instead of running it (with packed weights; shared fp32 weights
    keep HF's numerics and run it), and every greedy output is the request's lone run's.
    ``together``: both join in one step, with prefixes of different lengths from different rows."""
    tokenizer = build_tiny_tokenizer()
    decoder = build_decoder(build_tiny_model(tokenizer), weight_format=weights)
    first, other = _ids(tokenizer, SYSTEM + "What is 7 + 5?"), _ids(tokenizer, SYSTEM + "Spell cat backwards.")
    late = _ids(tokenizer, SYSTEM + "Name a colour.")
    assert len(first) > 40 and _common(late, other) >= 16
    batcher = ContinuousBatcher(decoder, tokenizer.pad_token_id)
    h_first = batcher.submit(GenRequest(first, greedy(3, ignore_eos=True)))
    batcher.submit(GenRequest(other, greedy(20, n=4, ignore_eos=True)))
    done: dict = {}
    while h_first not in done:
        done.update(dict(batcher.step()))
    assert batcher.num_running == 1  # the other request's 4 rows decode; the finished row stays (1/5 < 1/4)
    turn2 = first + tuple(done[h_first][0].token_ids) + _ids(tokenizer, " The tool says 12.")
    h_turn2 = batcher.submit(GenRequest(turn2, greedy(6, ignore_eos=True)))
    if not together:
        done.update(dict(batcher.step()))
    h_late = batcher.submit(GenRequest(late, greedy(5, ignore_eos=True)))
    while not batcher.idle:
        done.update(dict(batcher.step()))
    # turn 2 copies what the finished row ran (its prompt and 2 of its 3 tokens); the late
    # request copies the system prompt from a row that shares it
    late_donor = max(_common(late, other), _common(late, first if together else turn2))
    copied = {"packed": len(first) + 2 + late_donor, "shared": 0}[weights]
    assert batcher.stats.joins == (1 if together else 2) and batcher.stats.reused_prefix_tokens == copied
    for prompt, handle, n in ((turn2, h_turn2, 6), (late, h_late, 5)):
        ids = torch.tensor([prompt])
        mask = torch.ones_like(ids)
        alone = generate(decoder, ids, mask, mask.cumsum(1) - 1, greedy(n, ignore_eos=True), PAD)
        out = done[handle][0]
        assert out.token_ids == alone.responses[0].tolist()
        assert torch.allclose(torch.tensor(out.logprobs), alone.log_probs[0], atol=1e-5)


def _common(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n
