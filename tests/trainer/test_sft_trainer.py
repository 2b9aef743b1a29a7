"""The SFT trainer end to end on the tiny model: learning, exact resume, checkpoints, HF export, LoRA, CLI."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from hybridflow.config import load_sft_config
from hybridflow.data import write_rows
from hybridflow.data.tasks import ArithmeticSettings, generate_arithmetic
from hybridflow.data.tasks.arithmetic_sft import add_responses
from hybridflow.entrypoints.sft import build_sft_trainer, main
from hybridflow.models import load_model_and_tokenizer
from hybridflow.trainer.checkpoint import CONTROLLER_STATE, LATEST_FILE, MANIFEST_FILE

from .conftest import CrashAt


@pytest.fixture(scope="module")
def sft_files(tmp_path_factory) -> tuple[Path, Path]:
    """16 training and 4 validation one-digit additions with worked answers."""
    train, test = generate_arithmetic(16, 4, seed=0, settings=ArithmeticSettings(min_value=0, max_value=9))
    root = tmp_path_factory.mktemp("sft_data")
    return write_rows(add_responses(train), root / "train.parquet"), write_rows(
        add_responses(test), root / "test.parquet"
    )


def _config(tiny_model_dir, sft_files, out: Path, *extra: str):
    train, val = sft_files
    return load_sft_config(
        None,
        [
            f"model.path={tiny_model_dir}",
            f"data.train_files=[{train}]",
            f"data.val_files=[{val}]",
            "data.max_length=96",
            "data.train_batch_size=4",
            "data.micro_batch_size_per_gpu=2",
            "optim.lr=1e-3",
            f"trainer.default_local_dir={out}",
            "trainer.logger=[jsonl]",
            *extra,
        ],
    )


def _fit(config):
    trainer = build_sft_trainer(config)
    try:
        trainer.fit()
    finally:
        trainer.tracking.finish()
    return trainer


def _metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_training_the_tiny_model_lowers_the_loss(tiny_model_dir, sft_files, tmp_path):
    config = _config(
        tiny_model_dir,
        sft_files,
        tmp_path,
        "trainer.total_epochs=3",
        "optim.lr_scheduler_type=constant",
        "optim.lr_warmup_steps_ratio=0",
        "trainer.test_freq=6",
        "trainer.export_hf=false",
    )
    trainer = build_sft_trainer(config)
    before = trainer.validate()["val/loss"]
    trainer.fit()
    trainer.tracking.finish()
    rows = _metrics(tmp_path)
    assert [r["step"] for r in rows] == list(range(1, 13))  # 16 rows / 4 per step × 3 epochs
    assert [r["step"] for r in rows if "val/loss" in r] == [6, 12]  # test_freq, and the last step
    assert [r["train/epoch"] for r in rows] == [0.0] * 4 + [1.0] * 4 + [2.0] * 4
    assert rows[-1]["val/loss"] < 0.75 * before
    assert rows[-1]["train/loss"] < 0.75 * rows[0]["train/loss"]


def test_stop_and_resume_equals_an_uninterrupted_run(tiny_model_dir, sft_files, tmp_path):
    # 8 rows / 4 per step: steps 3-4 are a second epoch; cosine lr with warm-up; 2 micro-batches per step
    extra = (
        "trainer.total_training_steps=5",
        "trainer.save_freq=2",
        "trainer.test_freq=2",
        "optim.lr_warmup_steps=1",
        "trainer.export_hf=false",
    )
    _, val = sft_files
    small = write_rows(add_responses(generate_arithmetic(8, 0, seed=1)[0]), tmp_path / "small.parquet")
    files = (small, val)
    uninterrupted = _fit(_config(tiny_model_dir, files, tmp_path / "a", *extra))

    crashed = build_sft_trainer(_config(tiny_model_dir, files, tmp_path / "b", *extra))
    crashed.tracking = CrashAt(crashed.tracking, step=3)
    with pytest.raises(RuntimeError, match="simulated crash"):
        crashed.fit()
    crashed.tracking.finish()
    assert (tmp_path / "b" / LATEST_FILE).read_text() == "2"
    resumed = _fit(_config(tiny_model_dir, files, tmp_path / "b", *extra))

    assert resumed.global_step == uninterrupted.global_step == 5
    # bitwise by construction: both runs in this process with the same kernels; an exact resume
    # restores every weight, optimizer moment, data position and RNG state
    a, b = uninterrupted.engine.module.state_dict(), resumed.engine.module.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    saved_a = load_file(tmp_path / "a" / "global_step_5" / "actor" / "model.safetensors")
    saved_b = load_file(tmp_path / "b" / "global_step_5" / "actor" / "model.safetensors")
    assert all(torch.equal(saved_a[k], saved_b[k]) for k in saved_a)
    keys = ("train/loss", "train/lr", "train/grad_norm", "val/loss")
    rows_a, rows_b = _metrics(tmp_path / "a"), _metrics(tmp_path / "b")
    assert [r["step"] for r in rows_b] == [1, 2, 3, 4, 5]
    assert [[r.get(k) for k in keys] for r in rows_a] == [[r.get(k) for k in keys] for r in rows_b]


def test_checkpoint_layout_and_loadable_hf_folder(tiny_model_dir, sft_files, tmp_path):
    trainer = _fit(
        _config(
            tiny_model_dir,
            sft_files,
            tmp_path,
            "trainer.total_training_steps=2",
            "trainer.save_freq=1",
            "trainer.max_ckpt_to_keep=1",
        )
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["global_step_2", LATEST_FILE, "metrics.jsonl"]
    step = tmp_path / "global_step_2"
    assert sorted(p.name for p in step.iterdir()) == sorted(["actor", CONTROLLER_STATE, MANIFEST_FILE, "hf"])
    assert {"model.safetensors", "optimizer.pt", "extra_state.pt", "tokenizer", "hf_config"} <= {
        p.name for p in (step / "actor").iterdir()
    }
    # the same attention kernel as training (eager and SDPA differ in the last bits)
    kernel = trainer.engine.module.config._attn_implementation
    model, tokenizer = load_model_and_tokenizer(step / "hf", attn_implementation=kernel)
    ids = torch.tensor([[1, 445, 202, 43, 76, 2, 202, 1, 438, 202]])
    with torch.no_grad():
        expected = trainer.engine.module.eval()(input_ids=ids).logits
        assert torch.equal(model(input_ids=ids).logits, expected)
    assert tokenizer.chat_template == trainer.tokenizer.chat_template
    assert json.loads((step / "hf" / "config.json").read_text())["use_cache"] is True


def test_lora_trains_only_the_adapters_and_exports_merged_weights(tiny_model_dir, sft_files, tmp_path):
    trainer = _fit(
        _config(
            tiny_model_dir,
            sft_files,
            tmp_path,
            "trainer.total_training_steps=2",
            "model.lora_rank=4",
            "model.lora_alpha=8",
            "optim.lr=1e-2",
        )
    )
    base, _ = load_model_and_tokenizer(tiny_model_dir)
    peft_model = trainer.engine.module
    trained = peft_model.get_base_model().state_dict()
    for name, value in base.state_dict().items():  # LoRA-wrapped layers keep their weight under base_layer
        wrapped = name.replace(".weight", ".base_layer.weight")
        assert torch.equal(trained[wrapped if wrapped in trained else name], value), name
    assert any(v.abs().sum() > 0 for k, v in trained.items() if "lora_B" in k)
    merged, _ = load_model_and_tokenizer(tmp_path / "global_step_2" / "hf")
    assert type(merged).__name__ == "LlamaForCausalLM"
    ids = torch.tensor([[1, 445, 202, 43, 76, 2, 202, 1, 438, 202]])
    with torch.no_grad():
        want, got, old = (m.eval()(input_ids=ids).logits for m in (peft_model, merged, base))
    assert torch.allclose(got, want, atol=1e-5)
    assert not torch.allclose(got, old, atol=1e-3)  # the adapters changed the model


def test_multiturn_with_token_budget_micro_batches(tiny_model_dir, tmp_path):
    chat = [
        {"role": "user", "content": "What is 2 + 2?"},
        {"role": "assistant", "content": "4"},
        {"role": "user", "content": "And 3 + 3?"},
        {"role": "assistant", "content": "6"},
    ]
    path = write_rows([{"messages": chat[: 2 + 2 * (i % 2)]} for i in range(4)], tmp_path / "chats.jsonl")
    config = load_sft_config(
        None,
        [
            f"model.path={tiny_model_dir}",
            f"data.train_files=[{path}]",
            "data.val_files=[]",
            "data.multiturn.enable=true",
            "data.max_length=64",
            "data.train_batch_size=4",
            "data.use_dynamic_bsz=true",
            "data.max_token_len_per_gpu=64",
            "trainer.total_training_steps=1",
            f"trainer.default_local_dir={tmp_path / 'run'}",
            "trainer.logger=[jsonl]",
            "trainer.export_hf=false",
        ],
    )
    trainer = _fit(config)
    row = _metrics(tmp_path / "run")[0]
    assert row["train/num_loss_tokens"] == 2 * 2 + 2 * 4  # "4" + eos per turn; 1 or 2 turns per chat
    assert trainer.val_loader is None and "val/loss" not in row


def test_cli_runs_and_reports_bad_config_and_bad_data(tiny_model_dir, sft_files, tmp_path, capsys):
    train, val = sft_files
    common = [
        f"model.path={tiny_model_dir}",
        f"data.val_files=[{val}]",
        "data.max_length=96",
        "data.train_batch_size=8",
        f"trainer.default_local_dir={tmp_path / 'run'}",
        "trainer.total_training_steps=1",
    ]
    assert main([*common, f"data.train_files=[{train}]"]) == 0
    out = capsys.readouterr().out
    assert f"Hugging Face model folder: {tmp_path / 'run' / 'global_step_1' / 'hf'}" in out
    assert "step 1 | " in out and "loss " in out and "val_loss " in out

    assert main([*common, "data.max_lenght=96"]) == 2
    assert "data.max_lenght: unknown key; did you mean data.max_length?" in capsys.readouterr().err

    bad = write_rows(
        [{"prompt": "Hi", "response": "ok"}] * 7 + [{"prompt": "Hi", "response": None}], tmp_path / "bad.jsonl"
    )
    assert main([*common, f"data.train_files=[{bad}]", "trainer.resume_mode=disable"]) == 2
    assert f"{bad}: row 7: field 'response': expected a string, got NoneType" in capsys.readouterr().err

    assert main([*common, f"data.train_files=[{train}]", f"model.path={tmp_path / 'no_model'}"]) == 2
    assert (
        f"hybridflow sft: error: model path '{tmp_path / 'no_model'}' is not an existing folder"
        in capsys.readouterr().err
    )


def test_grpo_starts_from_the_sft_hf_folder(tiny_model_dir, sft_files, tiny_task_dir, tmp_path):
    from hybridflow.config import load_config
    from hybridflow.entrypoints.train import run as run_ppo

    from .conftest import tiny_overrides

    _fit(_config(tiny_model_dir, sft_files, tmp_path / "sft", "trainer.total_training_steps=1"))
    hf = tmp_path / "sft" / "global_step_1" / "hf"
    run_ppo(load_config(None, tiny_overrides(tiny_task_dir, tmp_path / "grpo", hf, "trainer.total_training_steps=1")))
    (row,) = _metrics(tmp_path / "grpo")
    assert row["step"] == 1 and row["response_length/mean"] > 0
    assert math.isfinite(row["actor/pg_loss"])


def test_a_crash_between_a_steps_row_and_its_commit_leaves_one_row_per_step(
    tiny_model_dir, sft_files, tmp_path, monkeypatch
):
    from hybridflow.trainer import checkpoint as ckpt

    config = _config(
        tiny_model_dir,
        sft_files,
        tmp_path,
        "trainer.total_training_steps=3",
        "trainer.save_freq=1",
        "trainer.export_hf=false",
    )
    real_commit = ckpt.commit_checkpoint

    def commit(paths, step, keep):
        if step == 2:
            raise RuntimeError("simulated crash")
        real_commit(paths, step, keep)

    with monkeypatch.context() as patch:
        patch.setattr(ckpt, "commit_checkpoint", commit)
        with pytest.raises(RuntimeError, match="simulated crash"):
            _fit(config)
    assert [r["step"] for r in _metrics(tmp_path)] == [1, 2]  # step 2's row went out before its commit
    _fit(config)  # resumes from step 1
    assert [r["step"] for r in _metrics(tmp_path)] == [1, 2, 3]
    assert [json.loads(line)["step"] for line in (tmp_path / "metrics.dropped.jsonl").read_text().splitlines()] == [2]
