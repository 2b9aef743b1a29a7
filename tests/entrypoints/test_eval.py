"""Offline evaluation: hand-computed mean@N / best@N / maj@N, bootstrap error bars, the CLI."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from hybridflow.config import ConfigError
from hybridflow.data import DataRowError, write_rows
from hybridflow.entrypoints.eval import main
from hybridflow.trainer.metrics import prompt_stats
from hybridflow.trainer.offline_eval import (
    bootstrap,
    evaluate,
    load_eval_config,
    report_path,
)

SCORER = '''
import time

def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    answer = solution_str.strip()
    if answer == "boom":
        raise RuntimeError("scorer crashed")
    if answer == "hang":
        time.sleep(30)
    return {"score": float(answer == str(ground_truth)), "pred": answer}

def score_without_pred(data_source, solution_str, ground_truth, extra_info=None):
    return float(solution_str.strip() == str(ground_truth))
'''


def _row(source: str, truth: str, responses: list[str]) -> dict:
    return {"data_source": source, "prompt": [{"role": "user", "content": "q"}],
            "reward_model": {"style": "rule", "ground_truth": truth}, "extra_info": {"index": 0}, "responses": responses}


# p0: scores 1,0,1 (answers 4,5,4) → mean 2/3, best 1, maj "4" → 1
# p1: scores 0,0,1 (answers 7,7,8) → mean 1/3, best 1, maj "7" → 0
# source "b": one response per prompt, scores 1 and 0
ROWS = [_row("a", "4", ["4", "5", "4"]), _row("a", "8", ["7", "7", "8"]), _row("b", "1", ["1"]), _row("b", "2", ["3"])]


@pytest.fixture
def scorer_file(tmp_path) -> Path:
    path = tmp_path / "scorer.py"
    path.write_text(SCORER)
    return path


def _config(data: Path, scorer: Path, *extra: str):
    return load_eval_config(None, [f"data.path={data}", f"custom_reward_function.path={scorer}",
                                   "reward_model.executor=inline", *extra])


def test_metrics_by_hand_with_majority_vote(tmp_path, scorer_file):
    data = write_rows(ROWS, tmp_path / "gen.parquet")
    report = evaluate(_config(data, scorer_file))
    a, b = report["data_sources"]["a"], report["data_sources"]["b"]
    assert (a["prompts"], a["responses"], a["n"], a["errors"]) == (2, 6, 3, 0)
    assert a["metrics"]["mean@3"]["value"] == pytest.approx(0.5)
    assert a["metrics"]["best@3"]["value"] == pytest.approx(1.0)
    assert a["metrics"]["maj@3"]["value"] == pytest.approx(0.5)
    assert a["metrics"]["best@3"]["std"] == 0.0  # both prompts have best 1: every resample is 1
    assert set(b["metrics"]) == {"mean@1"} and b["metrics"]["mean@1"]["value"] == pytest.approx(0.5)
    assert report["metrics"] == pytest.approx({
        "val-core/a/reward/mean@3": 0.5, "val-core/a/reward/best@3": 1.0, "val-core/a/reward/maj@3": 0.5,
        "val-core/b/reward/mean@1": 0.5,
    })


def test_prompt_stats_arrays():
    stats = prompt_stats(["a"] * 5, [0, 0, 0, 1, 1], [1.0, 0.0, 1.0, 0.0, 0.5], ["x", "y", "x", "z", "w"])["a"]
    assert stats.n == 3
    np.testing.assert_allclose(stats.mean, [2 / 3, 0.25])
    np.testing.assert_allclose(stats.best, [1.0, 0.5])
    np.testing.assert_allclose(stats.maj, [1.0, 0.0])  # p1: tie z/w → z (first seen), score 0


def test_bootstrap_spread_of_two_prompts_matches_the_exact_value():
    # resampling 2 prompts with values 0 and 1: the mean is 0, 0.5, 1 with probability 1/4, 1/2, 1/4,
    # so its standard deviation is sqrt(1/8) and the central 95% interval is [0, 1]
    est = bootstrap({"m": np.array([0.0, 1.0])}, 20000, np.random.default_rng(0), 0.95)["m"]
    assert est.value == 0.5
    assert est.std == pytest.approx(math.sqrt(1 / 8), abs=0.005)
    assert (est.ci_low, est.ci_high) == (0.0, 1.0)
    single = bootstrap({"m": np.array([0.25])}, 50, np.random.default_rng(1), 0.9)["m"]
    assert (single.value, single.std, single.ci_low, single.ci_high) == (0.25, 0.0, 0.25, 0.25)
    with pytest.raises(ValueError, match="non-empty arrays of one length"):
        bootstrap({"m": np.array([1.0]), "n": np.array([1.0, 2.0])}, 10, np.random.default_rng(0), 0.9)


def test_error_bars_are_seeded(tmp_path, scorer_file):
    rows = [_row("a", "1", ["1", "0"]), _row("a", "1", ["0", "0"]), _row("a", "1", ["1", "1"]), _row("a", "1", ["0", "1"])]
    data = write_rows(rows, tmp_path / "gen.jsonl")
    first = evaluate(_config(data, scorer_file, "metrics.seed=3"))["data_sources"]["a"]["metrics"]["mean@2"]
    again = evaluate(_config(data, scorer_file, "metrics.seed=3"))["data_sources"]["a"]["metrics"]["mean@2"]
    other = evaluate(_config(data, scorer_file, "metrics.seed=4"))["data_sources"]["a"]["metrics"]["mean@2"]
    assert first == again and first["value"] == other["value"] == 0.5
    assert first["std"] != other["std"] and 0.1 < first["std"] < 0.3  # exact: sqrt(0.125 / 4) ≈ 0.177


def test_no_majority_vote_without_pred_and_builtin_scorer(tmp_path, scorer_file):
    data = write_rows(ROWS[:2], tmp_path / "gen.parquet")
    report = evaluate(_config(data, scorer_file, "custom_reward_function.name=score_without_pred"))
    assert set(report["data_sources"]["a"]["metrics"]) == {"mean@3", "best@3"}
    arithmetic = [_row("hybridflow/arithmetic", "12", ["#### 12", "11"]), _row("hybridflow/arithmetic", "3", ["3", "#### 3"])]
    cfg = load_eval_config(None, [f"data.path={write_rows(arithmetic, tmp_path / 'arith.jsonl')}"])
    metrics = evaluate(cfg)["data_sources"]["hybridflow/arithmetic"]["metrics"]
    assert (metrics["mean@2"]["value"], metrics["best@2"]["value"]) == (0.75, 1.0)


def test_scorer_faults_score_zero_and_are_counted(tmp_path, scorer_file):
    data = write_rows([_row("a", "4", ["4", "boom", "hang"])], tmp_path / "gen.jsonl")
    cfg = _config(data, scorer_file, "reward_model.executor=process", "reward_model.timeout_s=0.5")
    entry = evaluate(cfg)["data_sources"]["a"]
    assert (entry["errors"], entry["timeouts"]) == (1, 1)
    assert entry["metrics"]["mean@3"]["value"] == pytest.approx(1 / 3)


def test_cli_prints_a_table_and_writes_json(tmp_path, scorer_file, capsys):
    data = write_rows(ROWS, tmp_path / "gen.parquet")
    assert main([f"data.path={data}", f"custom_reward_function.path={scorer_file}", "reward_model.executor=thread",
                 "metrics.n_bootstrap=200"]) == 0
    out = capsys.readouterr().out
    header, line_a, line_b = out.splitlines()[:3]
    assert header.split() == ["data_source", "prompts", "N", "mean@N", "best@N", "maj@N", "errors", "timeouts"]
    assert line_a.split()[:4] == ["a", "2", "3", "0.5000"] and "1.0000 ± 0.0000" in line_a
    assert line_b.split()[:4] == ["b", "2", "1", "0.5000"] and line_b.count(" - ") == 2
    written = json.loads((tmp_path / "gen.eval.json").read_text())
    assert written["n_bootstrap"] == 200 and written["input"] == str(data)
    assert written["data_sources"]["a"]["metrics"]["maj@3"]["value"] == pytest.approx(0.5)


def test_bad_input_is_named(tmp_path, scorer_file, capsys):
    assert main([]) == 2 and "data.path: required" in capsys.readouterr().err
    assert main(["data.path=x.jsonl", "metrics.confidence=1.5", "reward_model.executor=fork"]) == 2
    err = capsys.readouterr().err
    assert "metrics.confidence: must be < 1" in err and "reward_model.executor: unknown 'fork'" in err
    unknown = write_rows([_row("mystery/source", "1", ["1"])], tmp_path / "u.jsonl")
    with pytest.raises(ConfigError, match="no built-in scorer for data_source 'mystery/source'"):
        evaluate(load_eval_config(None, [f"data.path={unknown}"]))
    plain = write_rows([_row("a", "1", ["1"]) | {"responses": "1"}], tmp_path / "plain.jsonl")
    with pytest.raises(DataRowError, match="row 0: field 'responses': expected a non-empty list"):
        evaluate(_config(plain, scorer_file))
    no_truth = write_rows([_row("a", "1", ["1"]) | {"reward_model": {"style": "rule"}}], tmp_path / "nt.jsonl")
    assert main([f"data.path={no_truth}"]) == 2 and "field 'reward_model'" in capsys.readouterr().err
    renamed = load_eval_config(None, [f"data.path={plain}", "data.response_key=samples", "output_path=r.json"])
    with pytest.raises(DataRowError, match="field 'samples': missing column"):
        evaluate(renamed)
    assert report_path(renamed) == Path("r.json")
