"""The vision-language pipeline through the command lines: the built-in ``shapes`` task → ``hybridflow
sft`` on its image conversations (tiny Qwen2-VL) → the SFT checkpoint's Hugging Face folder and
``hybridflow export merge`` keep the image processor and reload in transformers → ``hybridflow train``
(GRPO) starts from that folder on the task's image prompts."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForImageTextToText

from hybridflow.entrypoints.data import main as data_main
from hybridflow.entrypoints.export import main as export_main
from hybridflow.entrypoints.sft import main as sft_main
from hybridflow.entrypoints.train import main as train_main
from hybridflow.models.processor import load_processor
from hybridflow.models.tiny_vlm import save_tiny_vlm


@pytest.fixture(scope="module")
def shapes(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("shapes")
    assert data_main(["shapes", "--out", str(out), "--train-size", "8", "--test-size", "4"]) == 0
    return out


@pytest.fixture(scope="module")
def sft_run(tmp_path_factory, shapes) -> Path:
    base = save_tiny_vlm(tmp_path_factory.mktemp("vlm") / "tiny-qwen2-vl")
    run_dir = tmp_path_factory.mktemp("sft_run")
    status = sft_main(
        [
            f"model.path={base}",
            f"data.train_files={shapes / 'sft.parquet'}",
            f"data.val_files={shapes / 'sft.parquet'}",
            "data.multiturn.enable=true",
            "data.multiturn.messages_key=messages",
            "data.train_batch_size=4",
            "data.micro_batch_size_per_gpu=2",
            "data.max_length=96",
            "optim.lr=1e-3",
            "trainer.total_training_steps=2",
            "trainer.logger=[jsonl]",
            f"trainer.default_local_dir={run_dir}",
        ]
    )
    assert status == 0
    return run_dir


def _rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]


def test_sft_on_image_conversations_trains_and_keeps_the_processor(sft_run) -> None:
    losses = [r["train/loss"] for r in _rows(sft_run) if "train/loss" in r]
    assert len(losses) == 2 and all(math.isfinite(x) for x in losses)
    hf = sft_run / "global_step_2" / "hf"
    processor = load_processor(hf)
    assert processor is not None and processor.image_token == "<|image_pad|>"
    model = AutoModelForImageTextToText.from_pretrained(hf)
    assert type(model).__name__ == "Qwen2VLForConditionalGeneration"


def test_export_merge_of_the_sft_checkpoint_is_a_vlm_folder(sft_run, tmp_path) -> None:
    target = tmp_path / "merged"
    actor = sft_run / "global_step_2" / "actor"
    assert export_main(["merge", "--local_dir", str(actor), "--target_dir", str(target)]) == 0
    assert load_processor(target) is not None
    merged = load_file(str(target / "model.safetensors"))
    trained = load_file(str(sft_run / "global_step_2" / "hf" / "model.safetensors"))
    assert merged.keys() == trained.keys() and any("visual" in k for k in merged)
    assert all(torch.equal(merged[k], trained[k]) for k in merged)


def test_grpo_starts_from_the_sft_folder_on_image_prompts(sft_run, shapes, tmp_path) -> None:
    run_dir = tmp_path / "grpo"
    status = train_main(
        [
            f"actor_rollout_ref.model.path={sft_run / 'global_step_2' / 'hf'}",
            f"data.train_files=[{shapes / 'train.parquet'}]",
            f"data.val_files=[{shapes / 'test.parquet'}]",
            "data.train_batch_size=4",
            "data.max_prompt_length=64",
            "data.max_response_length=4",
            "actor_rollout_ref.model.dtype=fp32",
            "actor_rollout_ref.actor.ppo_mini_batch_size=4",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
            "actor_rollout_ref.rollout.n=2",
            "trainer.total_training_steps=1",
            "trainer.val_before_train=false",
            "trainer.logger=[jsonl]",
            f"trainer.default_local_dir={run_dir}",
        ]
    )
    assert status == 0
    step = next(r for r in _rows(run_dir) if r.get("step") == 1 and "actor/pg_loss" in r)
    assert math.isfinite(step["actor/pg_loss"]) and step["response_length/mean"] > 0
    # the shapes scorer ran on the image prompts' answers
    assert 0.0 <= step["critic/score/mean"] <= 1.0
