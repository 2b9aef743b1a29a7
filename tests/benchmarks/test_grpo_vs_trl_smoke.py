"""The hybridflow-vs-TRL harness: both sides still run the same job (tiny model, 2 steps each).

A correctness check only — nothing here looks at how long anything took.
"""

from __future__ import annotations

import importlib
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

BENCH_DIR = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture
def bench(monkeypatch: pytest.MonkeyPatch):
    """``bench("common")`` imports a module of benchmarks/ (they import each other by flat name)."""
    monkeypatch.syspath_prepend(str(BENCH_DIR))
    return importlib.import_module


@pytest.fixture(scope="module")
def smoke_result(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    work = tmp_path_factory.mktemp("grpo_vs_trl")
    out = work / "result.json"
    cmd = [sys.executable, str(BENCH_DIR / "grpo_vs_trl.py"), "--model", str(tiny_model_dir), "--warmup", "1",
           "--steps", "1", "--repeats", "1", "--modes", "equal,free", "--max-new-tokens", "16", "--threads", "1",
           "--work-dir", str(work), "--out", str(out), "--timeout", "240"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "TRL/hybridflow" in proc.stdout and "=== mode equal" in proc.stdout and "=== mode free" in proc.stdout
    assert "compute dtype:" in proc.stdout and "CPU:" in proc.stdout
    result = json.loads(out.read_text())
    return result["modes"]["free"]["repetitions"][0] | {"_all": result}


def test_the_report_names_the_cpu_and_the_dtype_decision(smoke_result):
    result = smoke_result["_all"]
    assert result["machine"]["cpu"] and isinstance(result["machine"]["cpu_flags"], list)
    assert result["hardware"]["dtype"] in ("fp32", "bf16") and result["hardware"]["dtype_requested"] == "auto"
    assert result["hardware"]["auto_decision"].startswith("compute dtype: " + result["hardware"]["dtype"])
    assert result["settings"]["dtype"] == result["hardware"]["dtype"]
    for mode in ("equal", "free"):
        rep = result["modes"][mode]["repetitions"][0]
        # TRL gets the attention kernel hybridflow picked
        assert rep["trl"]["attn_implementation"] == rep["hybridflow"]["attn_implementation"] == "eager"


def test_equal_work_mode_generates_every_token_on_both_sides(smoke_result):
    rep = smoke_result["_all"]["modes"]["equal"]["repetitions"][0]
    for side in ("hybridflow", "trl"):
        for step in rep[side]["steps"]:
            assert step["gen_tokens"] == 32 * 16  # 8 prompts × 4 samples × exactly 16 tokens


def test_both_sides_ran_two_steps_on_the_same_prompts(smoke_result):
    assert smoke_result["same_first_prompts"] is True
    for side in ("hybridflow", "trl"):
        result = smoke_result[side]
        assert len(result["steps"]) == 2 and result["warmup_steps"] == 1
        assert result["rows_per_step"] == 32
        for step in result["steps"]:
            assert 0 < step["gen_tokens"] <= 32 * 16  # 8 prompts × 4 samples, ≤ 16 new tokens each
            assert 0.0 <= step["score_mean"] <= 1.0
            assert step["step_s"] >= step["gen_s"] > 0.0
            assert set(step["train"]) == {"grad_norm", "kl", "entropy"}
            assert all(math.isfinite(v) for v in step["train"].values())
        assert len(result["first_prompt_ids"]) == 8
        assert result["peak_mem_tree_mb"] >= result["peak_rss_sampled_mb"] > 100
        assert result["peak_rss_self_mb"] >= 0.95 * result["peak_rss_sampled_mb"]  # the true peak ≥ any sample


def test_one_generation_and_one_update_per_step_on_both_sides(smoke_result):
    trl = smoke_result["trl"]
    assert trl["generations_per_step"] == 1.0
    # neither side spends a forward on old log-probs (on-policy), both compute reference log-probs
    assert any("old log-probs: skipped" in w and "counted: 0 passes" in w for w in trl["work"])
    assert any("(1 call(s)/step, counted)" in w for w in trl["work"] if w.startswith("reference"))
    assert any(w.startswith("old log-probs: skipped") for w in smoke_result["hybridflow"]["work"])
    for step in smoke_result["hybridflow"]["steps"]:
        assert step["phases"]["ref"] > 0.0 and "old_log_prob" not in step["phases"]
        assert step["phases"]["update_actor"] > 0.0


def test_ratios_and_summary_are_consistent(smoke_result):
    summary, ratios = smoke_result["summary"], smoke_result["ratios"]
    mode = smoke_result["_all"]["modes"]["free"]["ratio_summary"]["step_time_trl_over_hybridflow"]
    assert mode["values"] == [ratios["step_time_trl_over_hybridflow"]] and mode["min"] == mode["median"] == mode["max"]
    hf, trl = summary["hybridflow"], summary["trl"]
    assert ratios["step_time_trl_over_hybridflow"] == pytest.approx(trl["median_step_s"] / hf["median_step_s"])
    assert ratios["peak_rss_trl_over_hybridflow"] == pytest.approx(
        smoke_result["trl"]["peak_rss_self_mb"] / smoke_result["hybridflow"]["peak_rss_self_mb"]
    )
    assert all(math.isfinite(v) and v > 0 for v in ratios.values())


def test_repetitions_alternate_and_the_median_is_reported(bench):
    gvt = bench("grpo_vs_trl")
    assert [gvt.side_order(["hybridflow", "trl"], r) for r in range(3)] == [
        ["hybridflow", "trl"], ["trl", "hybridflow"], ["hybridflow", "trl"]]
    reps = [{"ratios": {"step_time_trl_over_hybridflow": v, "peak_rss_trl_over_hybridflow": 1.0}} for v in (3.4, 2.9, 3.1)]
    summary = gvt.ratio_summary(reps)["step_time_trl_over_hybridflow"]
    assert (summary["median"], summary["min"], summary["max"]) == (3.1, 2.9, 3.4)
    assert gvt.median_repetition({"repetitions": reps}) is reps[2]
    four = reps + [{"ratios": {"step_time_trl_over_hybridflow": 5.0, "peak_rss_trl_over_hybridflow": 1.0}}]
    assert gvt.median_repetition({"repetitions": four}) is reps[2]  # the lower middle of 2.9, 3.1, 3.4, 5.0


def test_summary_uses_timed_steps_only(bench):
    common = bench("common")
    steps = [  # the first is the warm-up: 100 s must not show anywhere
        {"step_s": 100.0, "gen_s": 50.0, "gen_tokens": 1, "score_mean": 1.0, "phases": {"gen": 50.0}},
        {"step_s": 4.0, "gen_s": 2.0, "gen_tokens": 300, "score_mean": 0.25, "phases": {"gen": 2.0, "ref": 1.0}},
        {"step_s": 6.0, "gen_s": 3.0, "gen_tokens": 300, "score_mean": 0.5, "phases": {"gen": 3.0, "ref": 0.5}},
        {"step_s": 5.0, "gen_s": 1.0, "gen_tokens": 200, "score_mean": 0.0, "phases": {"gen": 1.0, "ref": 1.5}},
    ]
    summary = common.summarize_steps({"side": "x", "warmup_steps": 1, "rows_per_step": 32, "steps": steps})
    assert summary["median_step_s"] == 5.0 and summary["min_step_s"] == 4.0 and summary["max_step_s"] == 6.0
    assert summary["rollout_tokens_per_s"] == pytest.approx(800 / 6)
    assert summary["mean_response_tokens"] == pytest.approx(800 / 96)
    assert summary["mean_score"] == pytest.approx(0.25)
    assert summary["median_ref_s"] == 1.0 and summary["median_old_log_prob_s"] == 0.0
    assert summary["median_rest_s"] == pytest.approx(2.5)  # rests: 1.0, 2.5, 2.5


def evaluations(clock, step_times: tuple[float, ...]) -> list[float]:
    """Training seconds at which ``clock`` asks for an evaluation over steps of ``step_times``."""
    evaluated_at = []
    for step_s in step_times:
        if clock.eval_due():
            evaluated_at.append(clock.train_s)
            clock.mark_evaluated()
        clock.add(step_s)
    return evaluated_at


def test_learning_clock_schedule(bench):
    clock = bench("common").LearningClock(budget_s=10.0, eval_every_s=4.0)
    assert evaluations(clock, (3.0, 3.0, 3.0, 3.0)) == [0.0, 6.0, 9.0]  # due at 0, then at ≥ 4, then at ≥ 8
    assert clock.done() and clock.train_s == 12.0


def test_settings_reject_a_micro_batch_that_does_not_divide_the_step(bench):
    common = bench("common")
    with pytest.raises(ValueError, match="micro_batch=5 must divide the 32 responses"):
        common.BenchSettings(model="m", train_file="t", run_dir="r", micro_batch=5)
    with pytest.raises(ValueError, match="samples_per_prompt must be at least 2"):
        common.BenchSettings(model="m", train_file="t", run_dir="r", samples_per_prompt=1)


def test_trl_reward_function_is_hybridflows_arithmetic_scorer(bench):
    reward = bench("_trl_side").hybridflow_reward
    columns = {
        "data_source": ["hybridflow/arithmetic"] * 3,
        "reward_model": [{"style": "rule", "ground_truth": "68"}] * 3,
        "extra_info": [{"split": "train", "index": i} for i in range(3)],
    }
    chat = [[{"role": "assistant", "content": text}] for text in ("23 + 45 = 68. #### 68", "#### 67", "it is 68")]
    assert reward([], chat, **columns) == [1.0, 0.0, 1.0]  # the last: lenient last-number rule
    assert reward([], ["#### 68", "no number", "#### 68.0"], **columns) == [1.0, 0.0, 1.0]


def test_learning_clock_can_skip_the_evaluation_at_zero(bench):
    clock = bench("common").LearningClock(budget_s=10.0, eval_every_s=4.0, start_eval=False)
    assert evaluations(clock, (3.0, 3.0, 3.0, 3.0)) == [6.0, 9.0]


def test_held_out_accuracy_counts_solved_prompts_not_format_credit(bench):
    accuracy = bench("_hybridflow_side").held_out_accuracy
    metrics = {"val-core/mean": 0.37, "val-core/hybridflow/countdown/reward/mean@1": 0.37,
               "val-aux/hybridflow/countdown/acc/mean@1": 0.3, "val-aux/hybridflow/countdown/formatted/mean@1": 0.9}
    assert accuracy(metrics) == pytest.approx(0.3)
    assert accuracy({"val-core/mean": 0.5}) == 0.5  # a scorer without acc: its mean score
    two_sources = {"val-core/mean": 0.5, "val-aux/a/acc/mean@1": 0.2, "val-aux/b/acc/mean@1": 0.6}
    assert accuracy(two_sources) == pytest.approx(0.4)


def test_trl_greedy_accuracy_counts_countdown_acc_not_the_format_score(bench):
    side = bench("_trl_side")
    from hybridflow.data.tasks.countdown import DATA_SOURCE

    rows = [{"prompt": [{"role": "user", "content": "q"}], "data_source": DATA_SOURCE,
             "reward_model": {"style": "rule", "ground_truth": {"target": 9, "numbers": [1, 2, 3]}},
             "extra_info": {"index": i}} for i in range(3)]
    completions = ["#### (1 + 2) * 3", "#### 1 + 2 + 3", "no equation"]  # solved, well-formed but 6, nothing

    class Fake:  # stands in for model + tokenizer: returns the completions above as generated text
        training = False
        padding_side = "right"
        pad_token_id = eos_token_id = 0

        def eval(self):
            pass

        def train(self, mode):
            pass

        def apply_chat_template(self, messages, **kw):
            return messages[0]["content"]

        def __call__(self, texts, **kw):
            return {"input_ids": side.torch.zeros(len(texts), 1, dtype=side.torch.long)}

        def generate(self, input_ids, **kw):
            return side.torch.zeros(len(input_ids), 2, dtype=side.torch.long)

        def batch_decode(self, ids, **kw):
            return completions[: len(ids)]

    fake = Fake()
    assert side.greedy_accuracy(fake, fake, rows, max_new_tokens=4) == pytest.approx(1 / 3)


def test_learning_summary_over_seeds_by_hand(bench):
    learning = bench("learning_vs_trl")
    runs = [{"evals": [{"train_s": 0.0, "accuracy": 0.25}, {"train_s": 300.0, "accuracy": 0.5}]},
            {"evals": [{"train_s": 0.0, "accuracy": 0.25}, {"train_s": 306.0, "accuracy": 0.6}]},
            {"evals": [{"train_s": 0.0, "accuracy": 0.25}, {"train_s": 312.0, "accuracy": 0.7}]}]
    start, end = learning.over_seeds(runs, test_size=400)
    assert start["accuracy_sd"] == 0.0 and start["accuracy_mean"] == 0.25
    assert end["train_min"] == pytest.approx(5.1)
    assert end["accuracy_mean"] == pytest.approx(0.6)
    assert (end["accuracy_min"], end["accuracy_max"]) == (0.5, 0.7)
    assert end["accuracy_sd"] == pytest.approx(0.1)  # sample sd of 0.5, 0.6, 0.7
    assert end["se_one_run"] == pytest.approx((0.6 * 0.4 / 400) ** 0.5)  # 0.0245: ≤ 2.5 points at 400 prompts
    assert learning.binomial_se(0.5, 400) == pytest.approx(0.025)
