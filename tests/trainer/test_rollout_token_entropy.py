"""The rollout dump's per-token entropy (``trainer.rollout_token_rows``): the old-log-prob pass's
``entropys`` reach the dump, equal to the entropy recomputed from the actor's own logits."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from hybridflow import fields as F
from hybridflow.config import load_config
from hybridflow.entrypoints.train import run
from hybridflow.models.loader import load_model_and_tokenizer
from hybridflow.trainer import core
from hybridflow.view.run_reader import read_dump

from .conftest import tiny_overrides

TEMPERATURE = 0.7  # not 1: the entropy must be the one at the sampling temperature
TOKEN_ROWS = 3


def _record(tiny_task_dir: Path, tmp_path: Path, tiny_model_dir: Path, monkeypatch, *extra: str) -> dict[str, Any]:
    """One training step with per-token dump rows; returns the batch's tensors the dump saw."""
    seen: dict[str, Any] = {}
    real_dump = core.dump_rollouts

    def spy(out_dir, step, tokenizer, batch, token_rows=0):
        seen.update({key: value.clone() for key, value in batch.require_batch().items()})
        return real_dump(out_dir, step, tokenizer, batch, token_rows=token_rows)

    monkeypatch.setattr(core, "dump_rollouts", spy)
    overrides = tiny_overrides(
        tiny_task_dir,
        tmp_path / "run",
        tiny_model_dir,
        "trainer.total_training_steps=1",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2",  # two updates: ℓ_old is computed, not the shortcut
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
        f"actor_rollout_ref.rollout.temperature={TEMPERATURE}",
        f"trainer.rollout_data_dir={tmp_path / 'run' / 'rollouts'}",
        *extra,
    )
    run(load_config(None, overrides))
    return seen


def _entropy_from_logits(model_dir: Path, batch: dict[str, Any], row: int) -> torch.Tensor:
    """The initial actor's entropy of softmax(z / τ) at each response token of ``row``, run on
    the row alone without padding (positions 0…n−1): what step 1's old-log-prob pass saw."""
    module, _ = load_model_and_tokenizer(str(model_dir), dtype="fp32")
    module.eval()
    width = batch[F.PROMPTS].shape[1]
    real = batch[F.ATTENTION_MASK][row].bool()
    ids = batch[F.INPUT_IDS][row][real].unsqueeze(0)
    prompt_len = int(real[:width].sum())
    with torch.no_grad():
        logits = module(input_ids=ids, position_ids=torch.arange(ids.shape[1]).unsqueeze(0)).logits[0].float()
    z = logits[prompt_len - 1 : -1] / TEMPERATURE  # position t predicts token t + 1
    return torch.logsumexp(z, dim=-1) - (torch.softmax(z, dim=-1) * z).sum(-1)


def test_dumped_entropy_is_the_actors_entropy_per_response_token(tiny_task_dir, tmp_path, tiny_model_dir, monkeypatch):
    batch = _record(tiny_task_dir, tmp_path, tiny_model_dir, monkeypatch, f"trainer.rollout_token_rows={TOKEN_ROWS}")
    dump = tmp_path / "run" / "rollouts" / "1.jsonl"
    rows = [json.loads(line) for line in dump.read_text().splitlines()]
    assert len(rows) == 8
    for row in rows[:TOKEN_ROWS]:  # one entropy per response token, on the first k rows only
        assert len(row[F.ENTROPYS]) == len(row["tokens"]) == row["response_length"] > 0
        assert all(v is not None and v >= 0.0 for v in row[F.ENTROPYS])
    assert all(F.ENTROPYS not in row for row in rows[TOKEN_ROWS:])

    expected = _entropy_from_logits(tiny_model_dir, batch, row=0)
    assert rows[0][F.ENTROPYS] == pytest.approx(expected.tolist(), abs=1e-5)
    valid = batch[F.ATTENTION_MASK][0, -batch[F.RESPONSES].shape[1] :].bool()
    assert batch[F.ENTROPYS][0][valid].tolist() == pytest.approx(expected.tolist(), abs=1e-5)

    read, notes = read_dump(dump)  # what hybridflow view's rollout tab is served
    assert notes == [] and read[0][F.ENTROPYS] == rows[0][F.ENTROPYS]


def test_entropy_is_dropped_from_the_batch_without_token_rows(tiny_task_dir, tmp_path, tiny_model_dir, monkeypatch):
    batch = _record(tiny_task_dir, tmp_path, tiny_model_dir, monkeypatch)
    assert F.OLD_LOG_PROBS in batch and F.ENTROPYS not in batch  # verl's behaviour: the metric only
    rows = [json.loads(line) for line in (tmp_path / "run" / "rollouts" / "1.jsonl").read_text().splitlines()]
    assert all("tokens" not in row and F.ENTROPYS not in row for row in rows)
