"""verl keys that used to be accepted and unread now do what they say (or are refused)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest
import torch

from hybridflow import fields as F
from hybridflow.config import ConfigError, PFPPOConfig, load_config
from hybridflow.entrypoints.train import build_trainer, run
from hybridflow.protocol import DataProto
from hybridflow.trainer import checkpoint as ckpt
from hybridflow.trainer.pf_ppo import pf_ppo_resample

from .conftest import tiny_overrides


def _rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]


def test_val_only_validates_and_trains_nothing(tiny_task_dir, tmp_path, tiny_model_dir):
    run_dir = tmp_path / "run"
    cfg = load_config(None, tiny_overrides(tiny_task_dir, run_dir, tiny_model_dir, "trainer.val_only=true"))
    trainer = build_trainer(cfg)
    calls = []
    trainer.step = lambda *a, **k: calls.append(a)  # would be the training loop's only way in
    try:
        metrics = trainer.fit()
    finally:
        trainer.close()
    assert "val-core/mean" in metrics and trainer.global_steps == 0 and calls == []
    assert [r["step"] for r in _rows(run_dir)] == [0] and not list(run_dir.glob("global_step_*"))


def test_validation_data_dir_writes_verls_fields(tiny_task_dir, tmp_path, tiny_model_dir):
    dump = tmp_path / "val_dump"
    run(load_config(None, tiny_overrides(tiny_task_dir, tmp_path / "run", tiny_model_dir,
                                         f"trainer.validation_data_dir={dump}", "trainer.total_training_steps=1")))
    rows = [json.loads(line) for line in (dump / "1.jsonl").read_text().splitlines()]
    assert len(rows) == 8  # the tiny task's test split, one greedy response each
    assert set(rows[0]) >= {"input", "output", "gts", "score", "step"} and rows[0]["step"] == 1
    assert all(isinstance(r["input"], str) and r["input"] for r in rows) and all(isinstance(r["score"], float) for r in rows)
    truths = [json.loads(line)["reward_model"]["ground_truth"] for line in (tiny_task_dir / "test.jsonl").read_text().splitlines()]
    assert [r["gts"] for r in rows] == truths


def test_calculate_log_probs_keeps_or_drops_the_samplers_log_probs(tiny_task_dir, tmp_path, tiny_model_dir):
    for keep in (False, True):
        cfg = load_config(None, tiny_overrides(tiny_task_dir, tmp_path / f"run{keep}", tiny_model_dir,
                                               f"actor_rollout_ref.rollout.calculate_log_probs={str(keep).lower()}"))
        trainer = build_trainer(cfg)
        try:
            batch = DataProto.from_single_dict(next(iter(trainer.train_loader)))
            out, _ = trainer.producer.generate(trainer.producer.prepare(batch, 2, step=1), trainer.producer.sampling_meta(1))
        finally:
            trainer.close()
        assert (F.ROLLOUT_LOG_PROBS in out.batch.keys()) is keep


def test_pf_ppo_resamples_rows_by_score_reproducibly():
    scores = torch.zeros(6, 4)
    scores[:, -1] = torch.tensor([0.0, 0.0, 1.0, 0.0, 0.0, 0.0])
    data = DataProto.from_dict(tensors={F.TOKEN_LEVEL_SCORES: scores, "row": torch.arange(6)},
                               non_tensors={F.UID: np.array(list("abcdef"), dtype=object)})
    cfg = PFPPOConfig(reweight_method="pow", weight_pow=2.0)
    first = pf_ppo_resample(data, cfg, seed=1, step=3)
    assert len(first) == 6 and first.batch["row"].tolist() == [2] * 6  # only row 2 has weight > 1e-8
    mixed = torch.zeros(6, 4)
    mixed[:, -1] = torch.tensor([1.0, -1.0, 0.5, 1.0, 0.2, -0.7])
    data.batch[F.TOKEN_LEVEL_SCORES] = mixed
    a = pf_ppo_resample(data, cfg, seed=1, step=3).batch["row"].tolist()
    b = pf_ppo_resample(data, cfg, seed=1, step=3).batch["row"].tolist()
    c = pf_ppo_resample(data, cfg, seed=1, step=4).batch["row"].tolist()
    assert a == b and a != c  # seeded by trainer.seed and the step: resumed runs draw the same rows
    assert (pf_ppo_resample(data, cfg, seed=1, step=3).non_tensor_batch[F.UID] == np.array(list("abcdef"))[a]).all()


def test_pf_ppo_runs_with_gae_and_is_refused_without(tiny_task_dir, tmp_path, tiny_model_dir):
    rows = []
    run(load_config(None, tiny_overrides(tiny_task_dir, tmp_path / "run", tiny_model_dir,
                                         "algorithm.adv_estimator=gae", "algorithm.use_pf_ppo=true")))
    rows = _rows(tmp_path / "run")
    assert [r["step"] for r in rows] == [1, 2]
    with pytest.raises(ConfigError, match="use_pf_ppo=true resamples rows after GAE"):
        load_config(None, tiny_overrides(tiny_task_dir, tmp_path / "r2", tiny_model_dir, "algorithm.use_pf_ppo=true"))


def test_max_critic_ckpt_to_keep_prunes_the_critic_part(tiny_task_dir, tmp_path, tiny_model_dir):
    run_dir = tmp_path / "run"
    run(load_config(None, tiny_overrides(
        tiny_task_dir, run_dir, tiny_model_dir, "algorithm.adv_estimator=gae", "trainer.total_training_steps=3",
        "trainer.save_freq=1", "trainer.max_critic_ckpt_to_keep=1", "trainer.max_actor_ckpt_to_keep=2")))
    steps = [step for step, _ in ckpt.list_checkpoints(run_dir)]
    assert steps == [2, 3]  # actor retention: 2
    assert not (run_dir / "global_step_2" / "critic").exists() and (run_dir / "global_step_3" / "critic").is_dir()
    ckpt.verify_checkpoint(run_dir / "global_step_2")  # still a valid checkpoint (manifest updated)
    assert ckpt.dropped_parts(run_dir / "global_step_2") == ["critic"]
    cfg = load_config(None, tiny_overrides(
        tiny_task_dir, run_dir, tiny_model_dir, "algorithm.adv_estimator=gae", "trainer.total_training_steps=4",
        "trainer.resume_mode=resume_path", f"trainer.resume_from_path={run_dir / 'global_step_2'}"))
    trainer = build_trainer(cfg)
    try:
        with pytest.raises(ckpt.CheckpointError, match="critic was pruned"):
            trainer.fit()
    finally:
        trainer.close()


@pytest.mark.parametrize(
    "override, message",
    [
        ("actor_rollout_ref.rollout.multi_turn.interaction_config_path=/i.yaml", "interactions are not implemented"),
        ("actor_rollout_ref.model.override_config.attention_dropout=0.1", "not supported by hybridflow"),
        ("+actor_rollout_ref.ref.model.path=/m", "a reference model other than the actor's initial weights"),
    ],
)
def test_features_not_there_yet_are_refused_when_switched_on(override, message, tiny_task_dir, tmp_path, tiny_model_dir):
    with pytest.raises(ConfigError, match=message):
        load_config(None, tiny_overrides(tiny_task_dir, tmp_path, tiny_model_dir, override))


def test_optim_clip_grad_is_the_grad_clip(tiny_task_dir, tmp_path, tiny_model_dir, caplog):
    base = tiny_overrides(tiny_task_dir, tmp_path, tiny_model_dir)
    cfg = load_config(None, base + ["actor_rollout_ref.actor.optim.clip_grad=0.5", "critic.optim.clip_grad=2.0"])
    assert cfg.actor_rollout_ref.actor.grad_clip == 0.5 and cfg.critic.grad_clip == 2.0
    same = load_config(None, base + ["actor_rollout_ref.actor.optim.clip_grad=0.5", "actor_rollout_ref.actor.grad_clip=0.5"])
    assert same.actor_rollout_ref.actor.grad_clip == 0.5
    with pytest.raises(ConfigError, match="optim.clip_grad=0.5 and actor_rollout_ref.actor.grad_clip=0.7 set the same thing"):
        load_config(None, base + ["actor_rollout_ref.actor.optim.clip_grad=0.5", "actor_rollout_ref.actor.grad_clip=0.7"])


def test_loader_speed_knob_is_ignored_with_a_warning(tiny_task_dir, tmp_path, tiny_model_dir, caplog):
    with caplog.at_level(logging.WARNING, logger="hybridflow.config"):
        load_config(None, tiny_overrides(tiny_task_dir, tmp_path, tiny_model_dir, "data.dataloader_num_workers=8"))
    assert any("ignored: data.dataloader_num_workers" in r.getMessage() for r in caplog.records)


def test_reward_model_num_workers_reaches_every_manager(tiny_task_dir, tmp_path, tiny_model_dir):
    from hybridflow.entrypoints.train import build_reward_fns
    from hybridflow.models import load_tokenizer

    tokenizer = load_tokenizer(tiny_model_dir)
    for manager_name in ("naive", "dapo", "prime"):
        cfg = load_config(None, tiny_overrides(tiny_task_dir, tmp_path, tiny_model_dir,
                                               f"reward_model.reward_manager={manager_name}", "reward_model.num_workers=2"))
        manager, _ = build_reward_fns(cfg, tokenizer)
        try:
            assert manager.num_workers == 2
        finally:
            manager.close()
