"""Engine checkpoints: bit-identical resume, atomic writes, clear errors on bad folders."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from hybridflow import fields as FK
from hybridflow.algorithms.aggregation import agg_loss
from hybridflow.engine import TorchEngine
from hybridflow.engine.checkpoint import MODEL_FILE, atomic_directory, capture_rng_state, restore_rng_state
from hybridflow.engine.forward import response_log_probs
from hybridflow.models.tiny import build_tiny_model


def _engine() -> TorchEngine:
    return TorchEngine(build_tiny_model(seed=0), lr=1e-2, warmup_steps=3, total_steps=10)


def _train_step(engine: TorchEngine, batch) -> None:
    def loss_fn(outputs, micro):
        loss = agg_loss(-micro[FK.ADVANTAGES] * outputs["log_probs"], micro[FK.RESPONSE_MASK], "token-mean")
        return loss, {}

    engine.forward_backward(batch, response_log_probs, loss_fn)
    engine.optimizer_step()
    engine.lr_scheduler_step()


def test_save_load_round_trip_is_bit_identical(tmp_path, make_rollout_batch) -> None:
    batch = make_rollout_batch(seed=6).batch
    engine = _engine()
    _train_step(engine, batch)
    engine.save_checkpoint(tmp_path / "ckpt")
    noise_after_save = torch.rand(3)
    _train_step(engine, batch)
    expected = engine.infer(batch, response_log_probs)["log_probs"]
    expected_lr = engine.current_lr()

    resumed = TorchEngine(build_tiny_model(seed=1), lr=1e-2, warmup_steps=3, total_steps=10)
    torch.manual_seed(999)  # the checkpoint must restore the RNG too
    resumed.load_checkpoint(tmp_path / "ckpt")
    assert torch.equal(torch.rand(3), noise_after_save)
    _train_step(resumed, batch)
    assert torch.equal(resumed.infer(batch, response_log_probs)["log_probs"], expected)
    assert resumed.current_lr() == expected_lr


def test_weights_only_load_keeps_fresh_optimizer(tmp_path, make_rollout_batch) -> None:
    engine = _engine()
    _train_step(engine, make_rollout_batch(seed=7).batch)
    engine.save_checkpoint(tmp_path / "c")
    fresh = _engine()
    fresh.load_checkpoint(tmp_path / "c", load_optimizer=False)
    for (_, a), (_, b) in zip(engine.module.state_dict().items(), fresh.module.state_dict().items()):
        assert torch.equal(a, b)
    assert fresh.optimizer.state_dict()["state"] == {}


def test_tied_embeddings_stay_tied_after_load(tmp_path) -> None:
    engine = _engine()
    engine.save_checkpoint(tmp_path / "c")
    fresh = _engine()
    fresh.load_checkpoint(tmp_path / "c")
    assert fresh.module.lm_head.weight.data_ptr() == fresh.module.model.embed_tokens.weight.data_ptr()


def test_overwrite_is_atomic_and_failed_save_keeps_old(tmp_path) -> None:
    target = tmp_path / "c"
    with atomic_directory(target) as tmp:
        (tmp / "a.txt").write_text("old")
    with pytest.raises(RuntimeError, match="boom"):
        with atomic_directory(target) as tmp:
            (tmp / "a.txt").write_text("new")
            raise RuntimeError("boom")
    assert (target / "a.txt").read_text() == "old"
    with atomic_directory(target) as tmp:
        (tmp / "b.txt").write_text("new")
    assert sorted(p.name for p in target.iterdir()) == ["b.txt"]
    assert [p.name for p in tmp_path.iterdir()] == ["c"]  # no temp folders left behind


def test_incomplete_and_corrupt_checkpoints(tmp_path) -> None:
    engine = _engine()
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="incomplete: missing model.safetensors, optimizer.pt, extra_state.pt"):
        engine.load_checkpoint(tmp_path / "empty")
    engine.save_checkpoint(tmp_path / "c")
    (tmp_path / "c" / MODEL_FILE).write_bytes(b"not a safetensors file")
    with pytest.raises(RuntimeError, match="model.safetensors: could not load weights"):
        engine.load_checkpoint(tmp_path / "c")


def test_rng_state_round_trip() -> None:
    state = capture_rng_state()
    a = (torch.rand(2), np.random.rand(2), random.random())
    restore_rng_state(state)
    b = (torch.rand(2), np.random.rand(2), random.random())
    assert torch.equal(a[0], b[0]) and np.array_equal(a[1], b[1]) and a[2] == b[2]
