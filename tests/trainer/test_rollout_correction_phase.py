"""Rollout correction wired into training: decoupled IS weights and rejection go into the
batch after the old-log-prob phase; bypass mode trains against the rollout's log-probs."""

from __future__ import annotations

import json
import math

import pytest
import torch

from hybridflow import fields as F
from hybridflow.algorithms.policy_losses import get_policy_loss_fn
from hybridflow.config import load_config
from hybridflow.entrypoints.train import run
from hybridflow.protocol import DataProto
from hybridflow.trainer.rollout_correction import (
    apply_decoupled_correction,
    correction_mode,
    use_rollout_log_probs_as_old,
)
from hybridflow.workers.actor import ActorWorker

from .conftest import tiny_overrides

LOG3 = math.log(3.0)


def _config(*overrides: str):
    return load_config(None, ["actor_rollout_ref.rollout.calculate_log_probs=true", *overrides])


def _batch(old: list[float], rollout: list[float], mask: list[float]) -> DataProto:
    return DataProto.from_dict(tensors={
        F.OLD_LOG_PROBS: torch.tensor([old]), F.ROLLOUT_LOG_PROBS: torch.tensor([rollout]),
        F.RESPONSE_MASK: torch.tensor([mask]),
    })


def test_hand_computed_weights_mask_and_metrics():
    # δ = ℓ_old − ℓ_rollout = [0, −1, ln 3, (padding)]
    batch = _batch([-1.0, -2.0, -0.5, 0.0], [-1.0, -1.0, -0.5 - LOG3, 0.0], [1, 1, 1, 0])
    rc = _config("algorithm.rollout_correction.rollout_is=token", "algorithm.rollout_correction.rollout_rs=token_k1",
                 "algorithm.rollout_correction.rollout_is_threshold=2.0").algorithm.rollout_correction
    assert correction_mode(rc) == "decoupled"
    metrics = apply_decoupled_correction(batch, rc)
    weights = batch.batch[F.ROLLOUT_IS_WEIGHTS][0]
    # w = exp(δ) truncated at U = 2; 0 on padding
    torch.testing.assert_close(weights, torch.tensor([1.0, math.exp(-1.0), 2.0, 0.0]))
    # k1 = −δ must lie in [log ½, log 2]: token 1 (k1 = 1) and token 2 (k1 = −ln 3) are rejected
    assert batch.batch[F.RESPONSE_MASK].tolist() == [[1.0, 0.0, 0.0, 0.0]]
    assert metrics["rollout_corr/rollout_rs_token_k1_masked_fraction"] == pytest.approx(2 / 3)
    assert metrics["rollout_corr/rollout_rs_seq_masked_fraction"] == 1.0
    rho = [1.0, math.exp(-1.0), 3.0]
    assert metrics["rollout_corr/chi2_token"] == pytest.approx(sum(r * r for r in rho) / 3 - 1.0, rel=1e-5)
    assert metrics["rollout_corr/chi2_seq"] == pytest.approx(math.exp(2 * (LOG3 - 1.0)) - 1.0, rel=1e-5)
    assert metrics["rollout_corr/kl"] == pytest.approx((1.0 - LOG3) / 3, rel=1e-5)  # mean(ℓ_rollout − ℓ_old)
    assert metrics["rollout_corr/training_ppl"] == pytest.approx(math.exp(3.5 / 3), rel=1e-5)
    assert metrics["rollout_corr/rollout_ppl"] == pytest.approx(math.exp((2.5 + LOG3) / 3), rel=1e-5)
    assert metrics["rollout_corr/rollout_is_max"] == pytest.approx(2.0)
    clamped = [1.0, 0.5, 2.0]  # ESS clamps to [1/U, U] and normalises by the mean
    mean = sum(clamped) / 3
    ess = 1.0 / (sum((w / mean) ** 2 for w in clamped) / 3)
    assert metrics["rollout_corr/rollout_is_eff_sample_size"] == pytest.approx(ess, rel=1e-5)


def test_identical_log_probs_give_unit_weights_and_the_plain_loss_exactly(make_rollout_batch):
    data = make_rollout_batch(seed=2)
    old = torch.randn(data.batch[F.RESPONSE_MASK].shape, generator=torch.Generator().manual_seed(0)) - 2.0
    data.batch[F.OLD_LOG_PROBS], data.batch[F.ROLLOUT_LOG_PROBS] = old, old.clone()
    mask_before = data.batch[F.RESPONSE_MASK].clone()
    rc = _config("algorithm.rollout_correction.rollout_is=sequence",
                 "algorithm.rollout_correction.rollout_rs=seq_max_k3").algorithm.rollout_correction
    apply_decoupled_correction(data, rc)
    mask = data.batch[F.RESPONSE_MASK]
    assert torch.equal(mask, mask_before)
    assert torch.equal(data.batch[F.ROLLOUT_IS_WEIGHTS], mask)  # 1 on every response token
    log_prob = old + 0.1 * torch.randn(old.shape, generator=torch.Generator().manual_seed(1))
    loss = get_policy_loss_fn("vanilla")
    plain, _ = loss(old, log_prob, data.batch[F.ADVANTAGES], mask, "token-mean")
    weighted, _ = loss(old, log_prob, data.batch[F.ADVANTAGES], mask, "token-mean",
                       rollout_is_weights=data.batch[F.ROLLOUT_IS_WEIGHTS])
    assert torch.equal(plain, weighted)


def test_identical_log_probs_leave_the_actor_update_unchanged(make_config, make_rollout_batch):
    """The whole update (all optimizer steps) with decoupled correction on identical log-probs
    equals plain PPO bit for bit."""
    cfg = make_config()
    rc = _config("algorithm.rollout_correction.rollout_is=token").algorithm.rollout_correction

    def updated(correct: bool):
        data = make_rollout_batch(seed=4)
        worker = ActorWorker(cfg.actor_rollout_ref, share_name=None)
        worker.init_model()
        data.union(worker.compute_log_prob(data).select(batch_keys=[F.OLD_LOG_PROBS]))
        if correct:
            data.batch[F.ROLLOUT_LOG_PROBS] = data.batch[F.OLD_LOG_PROBS].clone()
            apply_decoupled_correction(data, rc)
        worker.update_actor(data)
        return {n: p.detach().clone() for n, p in worker.module.named_parameters()}

    plain, corrected = updated(False), updated(True)
    for name, value in plain.items():
        assert torch.equal(corrected[name], value), name


def test_bypass_uses_the_rollout_log_probs_as_old():
    batch = _batch([-1.0, -2.0], [-1.5, -0.5], [1, 1])
    use_rollout_log_probs_as_old(batch)
    assert batch.batch[F.OLD_LOG_PROBS].tolist() == [[-1.5, -0.5]]
    batch.batch.pop(F.ROLLOUT_LOG_PROBS)
    with pytest.raises(KeyError, match="calculate_log_probs=true"):
        use_rollout_log_probs_as_old(batch)


def _run(tiny_task_dir, tmp_path, tiny_model_dir, *extra: str) -> list[dict]:
    run_dir = tmp_path / "run"
    run(load_config(None, tiny_overrides(
        tiny_task_dir, run_dir, tiny_model_dir, "actor_rollout_ref.rollout.calculate_log_probs=true",
        "trainer.test_freq=-1", "data.val_files=[]", *extra,
    )))
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]


def test_bypass_mode_trains_against_the_rollout_log_probs(tiny_task_dir, tmp_path, tiny_model_dir):
    """bf16: the sampler's log-probs differ from the actor's, so a loss fed the rollout's log-probs
    sees a non-zero rollout/actor KL; before bypass was wired the on-policy shortcut made it 0."""
    rows = _run(tiny_task_dir, tmp_path, tiny_model_dir, "algorithm.rollout_correction.bypass_mode=true",
                "actor_rollout_ref.model.dtype=bf16")
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        assert "timing_s/old_log_prob" not in r  # no old-log-prob pass
        assert r["rollout_corr/k3_kl"] > 0.0 and r["rollout_corr/kl"] != 0.0 and math.isfinite(r["actor/pg_loss"])


def test_decoupled_mode_logs_verls_diagnostics(tiny_task_dir, tmp_path, tiny_model_dir):
    rows = _run(tiny_task_dir, tmp_path, tiny_model_dir, "algorithm.rollout_correction.rollout_is=token",
                "algorithm.rollout_correction.rollout_rs=token_k1", "algorithm.rollout_correction.rollout_rs_threshold=5.0")
    for r in rows:
        assert "timing_s/old_log_prob" in r
        for key in ("rollout_is_mean", "rollout_is_eff_sample_size", "rollout_rs_masked_fraction", "training_ppl",
                    "rollout_ppl", "kl", "k3_kl", "chi2_token", "chi2_seq"):
            assert math.isfinite(r[f"rollout_corr/{key}"]), key
        assert 0.5 < r["rollout_corr/rollout_is_mean"] < 2.0
