"""verl's fully-async config sets ``data.gen_batch_size: 1`` (its rollouter asserts it: prompts are
streamed). Ours streams chunks of ppo_mini_batch_size prompts whatever the loader batch is, so in
fully_async mode that value is read as null with a warning; elsewhere it stays an error."""

from __future__ import annotations

import logging

import pytest

from hybridflow.config import ConfigError, load_config

BASE = ["trainer.device=cpu", "data.train_batch_size=4", "data.gen_batch_size=1"]


def test_fully_async_reads_verls_streaming_switch_as_null(caplog):
    with caplog.at_level(logging.WARNING, logger="hybridflow.config"):
        cfg = load_config(
            None, [*BASE, "async_training.mode=fully_async", "actor_rollout_ref.actor.ppo_mini_batch_size=2"]
        )
    assert cfg.data.gen_batch_size is None
    assert any("ignored: data.gen_batch_size=1" in r.getMessage() for r in caplog.records)


def test_sync_mode_still_refuses_a_generation_batch_below_the_training_batch():
    with pytest.raises(ConfigError, match="data.gen_batch_size=1 differs from data.train_batch_size=4"):
        load_config(None, BASE)
