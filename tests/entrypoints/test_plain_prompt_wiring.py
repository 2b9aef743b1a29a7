"""``data.apply_chat_template=false`` reaches every place a prompt is rendered: the trainer's
loaders (training and validation), `hybridflow generate`, and the rule that refuses it with agent
loops (which always render through the chat template)."""

from __future__ import annotations

import pytest

from hybridflow.config import ConfigError, load_config
from hybridflow.data.prompt_text import plain_prompt_text
from hybridflow.entrypoints.generate import GenDataConfig, prompt_ids
from hybridflow.entrypoints.train import build_loaders
from hybridflow.models import load_tokenizer


def test_the_trainers_loaders_render_plain_prompts(tiny_model_dir, tiny_task_dir):
    cfg = load_config(
        None,
        [
            "trainer.device=cpu",
            f"actor_rollout_ref.model.path={tiny_model_dir}",
            f"data.train_files=[{tiny_task_dir / 'train.parquet'}]",
            f"data.val_files=[{tiny_task_dir / 'test.parquet'}]",
            "data.max_prompt_length=96",
            "data.apply_chat_template=false",
            "data.return_raw_chat=true",  # the messages, to compare with
        ],
    )
    tokenizer = load_tokenizer(tiny_model_dir)
    train, val = build_loaders(cfg, tokenizer)
    for loader in (train, val):
        row = loader.dataset[0]
        assert row["raw_prompt_ids"] == tokenizer(plain_prompt_text(row["raw_prompt"]))["input_ids"]


def test_generate_renders_chat_messages_as_plain_text(tiny_model_dir):
    tokenizer = load_tokenizer(tiny_model_dir)
    messages = [{"role": "user", "content": "What is 2 + 3?"}]
    data = GenDataConfig(apply_chat_template=False)
    ids = prompt_ids(tokenizer, messages, data, fail=AssertionError)
    assert ids == tokenizer("What is 2 + 3?")["input_ids"]
    templated = prompt_ids(tokenizer, messages, GenDataConfig(apply_chat_template=True), fail=AssertionError)
    assert templated != ids  # the tiny tokenizer has a template; the switch bypasses it


def test_agent_loops_refuse_plain_prompts():
    with pytest.raises(ConfigError, match="apply_chat_template=false cannot be used with"):
        load_config(None, ["data.apply_chat_template=false", "actor_rollout_ref.rollout.multi_turn.enable=true"])
