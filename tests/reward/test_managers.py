from __future__ import annotations

import logging
import math
import time

import pytest
import torch

from hybridflow.reward import (
    REWARD_MANAGERS,
    BatchRewardManager,
    DAPORewardManager,
    NaiveRewardManager,
    PrimeRewardManager,
    build_reward_manager,
    decode_items,
    normalize_result,
    overlong_penalty,
    place_scores,
    reward_fault_metrics,
)
from hybridflow.reward.outcomes import ScoreTypeError

RESPONSES = ["23 + 45 = 68\n#### 68", "It is 7.", "#### 3"]
TRUTHS = ["68", "7", "2"]


def _expected(lengths, scores, width):
    reward = torch.zeros(len(lengths), width)
    for i, (n, s) in enumerate(zip(lengths, scores)):
        reward[i, n - 1] = s
    return reward


def test_registry_names():
    assert REWARD_MANAGERS.names() == ["batch", "dapo", "naive", "prime"]
    with pytest.raises(ValueError, match="unknown reward manager 'fancy'; valid names: batch, dapo, naive, prime"):
        build_reward_manager("fancy", None)


def test_place_scores():
    reward = place_scores(torch.tensor([1.0, 0.5, 2.0]), torch.tensor([3, 1, 0]), 4)
    assert reward.tolist() == [[0, 0, 1.0, 0], [0.5, 0, 0, 0], [2.0, 0, 0, 0]]
    assert reward.dtype == torch.float32


@pytest.mark.parametrize("mask", ["attention", "response"])
def test_naive_scores_at_last_valid_token(make_batch, tokenizer, mask):
    data, lengths = make_batch(RESPONSES, TRUTHS, width=40, mask=mask)
    reward, info = NaiveRewardManager(tokenizer)(data)
    assert reward.shape == (3, 40)
    assert torch.equal(reward, _expected(lengths, [1.0, 1.0, 0.0], 40))
    assert info["score"] == [1.0, 1.0, 0.0] and info["formatted"] == [1.0, 0.0, 1.0]
    assert info["reward_error"] == info["reward_timeout"] == [0.0, 0.0, 0.0]
    assert reward_fault_metrics(info) == {"reward/errors": 0.0, "reward/timeouts": 0.0}


def test_batch_and_prime_match_naive(make_batch, tokenizer):
    data, _ = make_batch(RESPONSES, TRUTHS)
    naive, naive_info = NaiveRewardManager(tokenizer)(data)
    for manager in (BatchRewardManager(tokenizer), PrimeRewardManager(tokenizer, num_workers=2)):
        reward, info = manager(data)
        assert torch.equal(reward, naive) and info == naive_info


def test_mixed_sources_and_unknown_source(make_batch, tokenizer):
    data, lengths = make_batch(["#### 5", r"\boxed{5}"], ["5", "5"], data_sources=["openai/gsm8k", "lighteval/MATH"])
    reward, info = NaiveRewardManager(tokenizer)(data)
    assert reward.sum(-1).tolist() == [1.0, 1.0]
    # both scorers return dicts: their keys become columns, pred is what maj@N votes on
    assert set(info) == {"score", "acc", "pred", "reward_error", "reward_timeout"}
    assert info["pred"] == ["5", "5"] and info["acc"] == [1.0, 1.0]
    bad, _ = make_batch(["x"], ["1"], data_sources=["my/data"])
    with pytest.raises(ValueError, match="no built-in scorer for data_source 'my/data'.*custom_reward_function.path"):
        NaiveRewardManager(tokenizer)(bad)


def test_reward_fn_key(make_batch, tokenizer):
    data, _ = make_batch(["#### 5"], ["5"])
    data.non_tensor_batch["source"] = data.non_tensor_batch.pop("data_source")
    assert NaiveRewardManager(tokenizer, reward_fn_key="source")(data)[0].sum() == 1.0
    with pytest.raises(KeyError, match="needs the non-tensor 'data_source'"):
        NaiveRewardManager(tokenizer)(data)


def test_overlong_penalty_values():
    # max 10, buffer 4 → expected 6: lengths 3, 6 → 0; 8 → -(2/4); 10 → -1; factor 2 doubles it
    lengths = torch.tensor([3, 6, 8, 10])
    assert overlong_penalty(lengths, 10, 4, 1.0).tolist() == [0.0, 0.0, -0.5, -1.0]
    assert overlong_penalty(lengths, 10, 4, 2.0).tolist() == [0.0, 0.0, -1.0, -2.0]
    with pytest.raises(ValueError, match="buffer_len must be in 1..max_resp_len=10"):
        overlong_penalty(lengths, 10, 0, 1.0)


def always_one(data_source, solution_str, ground_truth, extra_info=None):
    return {"score": 1.0, "acc": 1.0}


def test_dapo_adds_the_penalty(make_batch, tokenizer):
    data, lengths = make_batch(["a", "a b c d e f", "a b c d e f g h i j k"], ["1"] * 3)
    max_len, buffer = max(lengths), 4
    manager = DAPORewardManager(
        tokenizer, compute_score=always_one, max_resp_len=max_len,
        overlong_buffer_enable=True, overlong_buffer_len=buffer, overlong_penalty_factor=1.0, overlong_buffer_log=True,
    )
    reward, info = manager(data)
    penalties = [min(-(n - (max_len - buffer)) / buffer, 0.0) for n in lengths]
    assert penalties[0] == 0.0 and penalties[2] == -1.0  # the longest hits the limit
    assert torch.allclose(reward, _expected(lengths, [1.0 + p for p in penalties], reward.shape[1]))
    assert info["overlong_reward"] == pytest.approx(penalties)
    assert info["overlong"] == [1.0 if p < 0 else 0.0 for p in penalties]
    plain, plain_info = DAPORewardManager(tokenizer, compute_score=always_one)(data)
    assert plain.sum().item() == 3.0 and "overlong" not in plain_info
    quiet = DAPORewardManager(tokenizer, compute_score=always_one, max_resp_len=max_len,
                              overlong_buffer_enable=True, overlong_buffer_len=buffer)
    quiet_reward, quiet_info = quiet(data)  # overlong_buffer.log=false: penalised, not logged
    assert torch.equal(quiet_reward, reward) and "overlong_reward" not in quiet_info
    for m in (manager, quiet):
        m.close()


def test_dapo_settings_are_checked(tokenizer):
    with pytest.raises(ValueError, match="max_resp_len is required"):
        DAPORewardManager(tokenizer, overlong_buffer_enable=True, overlong_buffer_len=4)
    with pytest.raises(ValueError, match="overlong_buffer_len must be in 1..max_resp_len=8"):
        DAPORewardManager(tokenizer, overlong_buffer_enable=True, overlong_buffer_len=9, max_resp_len=8)


def faulty(data_source, solution_str, ground_truth, extra_info=None):
    """Behaves according to the response text."""
    if "RAISE" in solution_str:
        raise KeyError("no such thing")
    if "NAN" in solution_str:
        return float("nan")
    if "TYPE" in solution_str:
        return "1.0"
    if "NOSCORE" in solution_str:
        return {"acc": 1.0}
    if "HANG" in solution_str:
        time.sleep(60)
    return {"score": 1.0, "acc": 1.0}


FAULTY = ["fine", "RAISE", "NAN", "TYPE", "NOSCORE", "HANG", "fine"]


@pytest.mark.parametrize("name", ["naive", "prime", "dapo"])
def test_faults_score_zero_and_are_counted(make_batch, tokenizer, caplog, name):
    data, lengths = make_batch(FAULTY, ["1"] * len(FAULTY))
    manager = build_reward_manager(name, tokenizer, compute_score=faulty, timeout_s=0.5)
    with caplog.at_level(logging.WARNING, logger="hybridflow.reward.base"):
        reward, info = manager(data)
        manager(data)  # a second step logs nothing new
    assert reward.sum(-1).tolist() == [1.0, 0, 0, 0, 0, 0, 1.0]
    assert info["reward_error"] == [0.0, 1.0, 1.0, 1.0, 1.0, 0.0, 0.0]
    assert info["reward_timeout"] == [0.0, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0]
    assert info["acc"] == [1.0, None, None, None, None, None, 1.0]
    assert reward_fault_metrics(info) == {"reward/errors": 4.0, "reward/timeouts": 1.0}
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 2  # the first error and the first timeout, once each
    assert "KeyError" in messages[0] and "no such thing" in messages[0]
    assert "timeout" in messages[1]


def batch_raises(data_sources, solution_strs, ground_truths, extra_infos):
    raise RuntimeError("batch scorer broke")


def batch_short(data_sources, solution_strs, ground_truths, extra_infos):
    return [1.0]


def batch_mixed(data_sources, solution_strs, ground_truths, extra_infos):
    return [1.0, math.nan, {"score": 0.5}]


def test_batch_manager_faults(make_batch, tokenizer):
    data, _ = make_batch(["a", "b", "c"], ["1"] * 3)
    reward, info = BatchRewardManager(tokenizer, compute_score=batch_raises)(data)
    assert reward.abs().sum() == 0 and info["reward_error"] == [1.0] * 3
    reward, info = BatchRewardManager(tokenizer, compute_score=batch_short)(data)
    assert info["reward_error"] == [1.0] * 3
    reward, info = BatchRewardManager(tokenizer, compute_score=batch_mixed)(data)
    assert reward.sum(-1).tolist() == [1.0, 0.0, 0.5] and info["reward_error"] == [0.0, 1.0, 0.0]


def test_num_examine_prints_per_source(make_batch, tokenizer, capsys):
    data, _ = make_batch(["#### 68", "#### 1"], ["68", "1"], prompts=["What is 23 + 45?", "other"])
    NaiveRewardManager(tokenizer, num_examine=1)(data)
    out = capsys.readouterr().out
    assert out.count("[prompt]") == 1
    assert "[prompt] What is 23 + 45?" in out and "[response] #### 68" in out and "[score] 1.0" in out


def _outer_pid() -> int:
    """This process's pid as the trainer sees it: a scorer in its own PID namespace is pid 1
    there, but /proc (the trainer's mount) names it by its outer pid."""
    import os

    return int(os.readlink("/proc/self"))


def scorer_pid(data_source, solution_str, ground_truth, extra_info=None):
    return {"score": 1.0, "pid": _outer_pid()}


def test_manager_scores_in_processes_it_keeps(make_batch, tokenizer):
    import os
    import pickle

    data, _ = make_batch(RESPONSES, TRUTHS, width=40)
    manager = NaiveRewardManager(tokenizer, compute_score=scorer_pid, num_workers=1)
    try:
        first = set(manager(data)[1]["pid"])
        again = set(manager(data)[1]["pid"])
        assert len(first) == 1 and first == again and os.getpid() not in first
        copy = pickle.loads(pickle.dumps(manager))  # a copy forks processes of its own
        try:
            assert set(copy(data)[1]["pid"]).isdisjoint(first)
        finally:
            copy.close()
    finally:
        manager.close()
    with pytest.raises(RuntimeError, match="closed"):
        manager(data)


def batch_scorer_pid(data_sources, solution_strs, ground_truths, extra_infos):
    return [{"score": 1.0, "pid": _outer_pid()}] * len(data_sources)


def test_batch_manager_scores_in_a_kept_process(make_batch, tokenizer):
    import os

    data, _ = make_batch(RESPONSES, TRUTHS, width=40)
    manager = BatchRewardManager(tokenizer, compute_score=batch_scorer_pid)
    try:
        first, again = set(manager(data)[1]["pid"]), set(manager(data)[1]["pid"])
        assert len(first) == 1 and first == again and os.getpid() not in first
    finally:
        manager.close()


def test_naive_manager_times_hanging_items_out_together(make_batch, tokenizer):
    data, _ = make_batch(["HANG"] * 8, ["1"] * 8)
    manager = NaiveRewardManager(tokenizer, compute_score=faulty, timeout_s=2.0)
    try:
        start = time.monotonic()
        _, info = manager(data)
        elapsed = time.monotonic() - start
    finally:
        manager.close()
    assert info["reward_timeout"] == [1.0] * 8
    assert elapsed < 10.0, f"8 hanging items × 2 s took {elapsed:.1f} s (one after another: 16 s)"


def batch_slow(data_sources, solution_strs, ground_truths, extra_infos):
    time.sleep(0.2 * len(solution_strs))  # 0.2 s per item
    return [1.0] * len(solution_strs)


def batch_hangs(data_sources, solution_strs, ground_truths, extra_infos):
    time.sleep(60)


def test_batch_manager_timeout_applies_per_item(make_batch, tokenizer):
    data, _ = make_batch(["a", "b", "c", "d", "e"], ["1"] * 5)
    # 5 items × 0.2 s = 1 s: past timeout_s=0.5 for one call, within 5 × 0.5 s for five items
    manager = BatchRewardManager(tokenizer, compute_score=batch_slow, timeout_s=0.5)
    try:
        reward, info = manager(data)
    finally:
        manager.close()
    assert reward.sum(-1).tolist() == [1.0] * 5 and info["reward_timeout"] == [0.0] * 5
    two, _ = make_batch(["a", "b"], ["1"] * 2)
    manager = BatchRewardManager(tokenizer, compute_score=batch_hangs, timeout_s=0.3)
    try:
        outcomes = manager.score_items(decode_items(two, tokenizer))
    finally:
        manager.close()
    assert [o.status for o in outcomes] == ["timeout"] * 2
    assert outcomes[0].message == "the batch call (2 items × timeout_s=0.3) returned nothing within 0.6 s"


def overflowing(data_source, solution_str, ground_truth, extra_info=None):
    return {"big": 1e300, "neg": -1e300, "dict": {"score": 1e39}, "max": 3.4e38}[solution_str]


def test_scores_that_overflow_float32_are_errors(make_batch, tokenizer):
    data, lengths = make_batch(["big", "neg", "dict", "max"], ["1"] * 4)
    reward, info = NaiveRewardManager(tokenizer, compute_score=overflowing, executor="inline", timeout_s=None)(data)
    assert info["reward_error"] == [1.0, 1.0, 1.0, 0.0]
    assert reward_fault_metrics(info)["reward/errors"] == 3.0
    assert torch.isfinite(reward).all() and reward.sum(-1).tolist() == [0.0, 0.0, 0.0, pytest.approx(3.4e38, rel=1e-6)]
    with pytest.raises(ScoreTypeError, match=r"the score is 1e\+300, which is ±inf as float32"):
        normalize_result(1e300)


# ---------------------------------------------------------------- with a reward model's scores
def _arith_batch_with_rm_scores():
    import numpy as np

    from hybridflow import fields as F
    from hybridflow.models import load_tokenizer
    from hybridflow.protocol import DataProto

    tok = load_tokenizer("tiny-llama")
    texts = ["#### 5", "#### 6"]
    ids = [tok(t, add_special_tokens=False)["input_ids"] for t in texts]
    width = max(map(len, ids)) + 1
    responses = torch.full((2, width), tok.pad_token_id)
    mask = torch.zeros((2, width), dtype=torch.long)
    for i, row in enumerate(ids):
        responses[i, : len(row)] = torch.tensor(row)
        mask[i, : len(row)] = 1
    rm = torch.zeros((2, width))
    rm[0, len(ids[0]) - 1], rm[1, len(ids[1]) - 1] = 0.25, -1.5
    obj = lambda values: np.array(values, dtype=object)  # noqa: E731
    batch = DataProto.from_dict(
        tensors={F.RESPONSES: responses, F.RESPONSE_MASK: mask, F.RM_SCORES: rm},
        non_tensors={F.DATA_SOURCE: obj(["hybridflow/arithmetic"] * 2),
                     F.REWARD_MODEL: obj([{"ground_truth": "5"}, {"ground_truth": "5"}])},
    )
    return tok, batch, rm


@pytest.mark.parametrize("mode", ["off", "log", "add"])
def test_rm_scores_are_the_reward_and_rules_log_or_add(mode):
    from hybridflow.reward import RULE_SCORE, build_reward_manager

    tok, batch, rm = _arith_batch_with_rm_scores()
    manager = build_reward_manager("naive", tok, executor="inline", timeout_s=None, rule_reward=mode)
    reward, extra = manager(batch)
    if mode == "off":  # verl: the reward model's scores are the reward; no rule runs
        assert torch.equal(reward, rm) and extra == {"reward_error": [0.0, 0.0], "reward_timeout": [0.0, 0.0]}
        return
    assert extra[RULE_SCORE] == [1.0, 0.0]  # "#### 5" is right, "#### 6" wrong
    assert "score" not in extra  # the rule's score column is rule_score here, not the reward
    expected = rm.clone()
    if mode == "add":
        expected[0, rm[0].nonzero()[0, 0]] += 1.0
    assert torch.equal(reward, expected)


def test_a_nan_reward_model_score_scores_0_and_is_counted():
    from hybridflow import fields as F
    from hybridflow.reward import build_reward_manager, reward_fault_metrics

    tok, batch, rm = _arith_batch_with_rm_scores()
    batch.batch[F.RM_SCORES][1, 0] = float("nan")
    for mode in ("off", "log"):
        reward, extra = build_reward_manager("naive", tok, executor="inline", timeout_s=None, rule_reward=mode)(batch)
        assert torch.isfinite(reward).all() and reward[1].abs().sum() == 0 and reward[0].sum() == pytest.approx(0.25)
        assert reward_fault_metrics(extra)["reward/errors"] == 1.0
