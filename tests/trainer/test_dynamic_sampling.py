"""DAPO dynamic sampling: groups whose responses all score alike are dropped and refilled."""

from __future__ import annotations

import json
from collections import defaultdict

import numpy as np
import pytest
import torch

from hybridflow import fields as F
from hybridflow.config import load_config
from hybridflow.entrypoints.train import run
from hybridflow.protocol import DataProto
from hybridflow.trainer.filters import response_metric, varied_group_rows

from .conftest import tiny_overrides

# Prompts with an even answer get the dense score (it varies within a group); the others
# get 0.5 for every response, so their groups carry no signal and must be dropped.
HALF_FLAT_SCORER = '''
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    if int(ground_truth) % 2:
        return {"score": 0.5, "acc": 1.0}
    dense = sum("a" <= ch <= "z" for ch in solution_str) / max(len(solution_str), 1)
    return {"score": dense, "acc": float(dense > 0.5)}
'''

FLAT_SCORER = '''
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return 1.0
'''


def test_varied_group_rows_by_hand():
    uids = np.array(["a", "a", "b", "b", "c", "c", "d"], dtype=object)
    rows, kept = varied_group_rows(np.array([1.0, 1.0, 0.0, 1.0, 0.0, 0.0, 3.0]), uids)
    assert rows.tolist() == [2, 3, 6] and kept == 2  # b varies; d has one response, kept as verl does
    rows, kept = varied_group_rows(np.zeros(7), uids)
    assert rows.tolist() == [6] and kept == 1


def test_response_metric_reads_scores_or_scorer_keys():
    scores = torch.zeros(3, 4)
    scores[:, -1] = torch.tensor([0.5, 1.0, 0.0])
    batch = DataProto.from_dict(
        tensors={F.TOKEN_LEVEL_SCORES: scores}, non_tensors={"acc": np.array([1, 0, "x"], dtype=object)}
    )
    assert response_metric(batch, "score").tolist() == [0.5, 1.0, 0.0]
    assert response_metric(batch, "seq_reward").tolist() == [0.5, 1.0, 0.0]
    with pytest.raises(ValueError, match=r"filter_groups.metric='acc': the scorer's 'acc' of item 2 is 'x', not a number"):
        response_metric(batch, "acc")
    with pytest.raises(ValueError, match=r"'pred' is neither a summed score .*this batch has: acc"):
        response_metric(batch, "pred")


@pytest.mark.parametrize("metric", ["score", "acc"])
def test_training_batches_hold_only_varied_groups(metric, tiny_task_dir, tmp_path, tiny_model_dir):
    scorer = tmp_path / "half_flat.py"
    scorer.write_text(HALF_FLAT_SCORER)
    run_dir, dump = tmp_path / "run", tmp_path / "rollouts"
    run(load_config(None, tiny_overrides(
        tiny_task_dir, run_dir, tiny_model_dir, f"custom_reward_function.path={scorer}",
        "algorithm.filter_groups.enable=true", f"algorithm.filter_groups.metric={metric}",
        "actor_rollout_ref.rollout.n=4", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16",
        f"trainer.rollout_data_dir={dump}",
    )))
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        assert r["train/num_gen_batches"] >= 1 and r["train/kept_groups"] >= 4
    assert max(r["train/num_gen_batches"] for r in rows) > 1  # odd-answer prompts had to be replaced
    for step in (1, 2):
        groups = defaultdict(list)
        for line in (dump / f"{step}.jsonl").read_text().splitlines():
            row = json.loads(line)
            groups[row["uid"]].append(row["score"])
        assert len(groups) == 4 and all(len(s) == 4 for s in groups.values())  # train_batch_size × n rows
        if metric == "score":
            assert all(len(set(s)) > 1 for s in groups.values()), groups


def test_gives_up_after_max_num_gen_batches_with_a_clear_error(tiny_task_dir, tmp_path, tiny_model_dir):
    scorer = tmp_path / "flat.py"
    scorer.write_text(FLAT_SCORER)
    cfg = load_config(None, tiny_overrides(
        tiny_task_dir, tmp_path / "run", tiny_model_dir, f"custom_reward_function.path={scorer}",
        "algorithm.filter_groups.enable=true", "algorithm.filter_groups.max_num_gen_batches=2",
    ))
    with pytest.raises(RuntimeError, match=r"2 generation batches left only 0 of 4 prompt groups whose responses differ"):
        run(cfg)


def test_seq_final_reward_with_kl_in_reward_is_refused(tiny_task_dir, tmp_path, tiny_model_dir):
    # refused when the config loads (a config rule; ConfigError is a ValueError)
    with pytest.raises(ValueError, match="seq_final_reward needs the in-reward KL"):
        run(load_config(None, tiny_overrides(
            tiny_task_dir, tmp_path / "run", tiny_model_dir, "algorithm.filter_groups.enable=true",
            "algorithm.filter_groups.metric=seq_final_reward", "algorithm.use_kl_in_reward=true",
        )))


def test_larger_generation_batches_train_on_train_batch_size_groups(tiny_task_dir, tmp_path, tiny_model_dir):
    scorer = tmp_path / "half_flat.py"
    scorer.write_text(HALF_FLAT_SCORER)
    run_dir, dump = tmp_path / "run", tmp_path / "rollouts"
    run(load_config(None, tiny_overrides(
        tiny_task_dir, run_dir, tiny_model_dir, f"custom_reward_function.path={scorer}",
        "algorithm.filter_groups.enable=true", "data.gen_batch_size=12", "actor_rollout_ref.rollout.n=4",
        "trainer.total_training_steps=1", f"trainer.rollout_data_dir={dump}",
    )))
    [row] = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    assert row["train/num_gen_batches"] == 1 and row["train/kept_groups"] >= 4  # 12 prompts, ~half varied
    uids = {json.loads(line)["uid"] for line in (dump / "1.jsonl").read_text().splitlines()}
    assert len(uids) == 4


def test_gen_batch_size_needs_dynamic_sampling(tiny_task_dir, tmp_path, tiny_model_dir):
    from hybridflow.config.errors import ConfigError

    with pytest.raises(ConfigError, match="only makes sense with algorithm.filter_groups.enable=true"):
        load_config(None, tiny_overrides(tiny_task_dir, tmp_path / "run", tiny_model_dir, "data.gen_batch_size=8"))
