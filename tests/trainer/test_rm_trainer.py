"""The reward-model trainer on the tiny model: the Bradley–Terry loss, split invariance, learning,
exact resume, the exported folder, config and input errors, the CLI."""

from __future__ import annotations

import copy
import json
import math
import re
from pathlib import Path

import pytest
import torch

from hybridflow.config import ConfigError
from hybridflow.config.generate import RM_DOC, RM_DOC_REGIONS, fill_regions
from hybridflow.config.rm import RMConfig
from hybridflow.config.rm_rules import load_rm_config
from hybridflow.config.spec import iter_leaves
from hybridflow.data import collate_fn, write_rows
from hybridflow.data.pair_dataset import PairDataset
from hybridflow.data.tasks import TASKS
from hybridflow.engine import MicroBatchSpec
from hybridflow.engine.torch_engine import TorchEngine
from hybridflow.entrypoints.data import build_parser
from hybridflow.entrypoints.rm import build_rm_trainer, main
from hybridflow.models.reward_model import (
    last_token_scores,
    load_reward_model,
    reward_model_from_lm,
)
from hybridflow.trainer.checkpoint import LATEST_FILE
from hybridflow.trainer.supervised.rm_loss import (
    CHOSEN_REWARDS,
    REJECTED_REWARDS,
    bradley_terry_loss,
    pair_rewards,
    rm_loss,
)
from hybridflow.trainer.supervised.rm_trainer import HF_FOLDER, MODEL_DIR, to_tensordict
from tests.numerics import TINY_DEPTH, TINY_WIDTH, assert_close_across

from .conftest import CrashAt

pytestmark = pytest.mark.usefixtures("one_torch_thread")
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def pair_file(tmp_path_factory) -> Path:
    """32 one-digit arithmetic pairs (a tiny random model cannot learn addition in 40 steps, so the
    learning test validates on these training pairs: it checks that the loop fits the objective)."""
    args = build_parser().parse_args(
        [
            "arithmetic-pairs",
            "--out",
            "x",
            "--digits",
            "1",
            "--train-size",
            "32",
            "--test-size",
            "8",
            "--exclude-test-size",
            "0",
        ]
    )
    train, _ = TASKS.get("arithmetic-pairs").build(args)
    return write_rows(train, tmp_path_factory.mktemp("rm_data") / "pairs.parquet")


def _config(pair_file: Path, out: Path, *extra: str) -> RMConfig:
    return load_rm_config(
        None,
        [
            "model.path=tiny-llama",
            "model.dtype=fp32",
            f"data.train_files=[{pair_file}]",
            f"data.val_files=[{pair_file}]",
            "data.max_length=128",
            "data.train_batch_size=8",
            "data.micro_batch_size_per_gpu=4",
            "optim.lr=2e-3",
            "optim.lr_scheduler_type=constant",
            "optim.lr_warmup_steps_ratio=0",
            f"trainer.default_local_dir={out}",
            "trainer.logger=[jsonl]",
            *extra,
        ],
    )


def _fit(config: RMConfig):
    trainer = build_rm_trainer(config)
    try:
        trainer.fit()
    finally:
        trainer.tracking.finish()
    return trainer


def _metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_bradley_terry_loss_by_hand():
    chosen, rejected = torch.tensor([1.0, 0.0, 0.0, 100.0, -100.0]), torch.tensor([0.0, 0.0, 1.0, 0.0, 0.0])
    expected = [math.log(1 + math.exp(-1)), math.log(2), math.log(1 + math.e), 0.0, 100.0]
    assert bradley_terry_loss(chosen, rejected).tolist() == pytest.approx(expected, abs=1e-6)
    # a micro-batch of 2 of a 4-pair batch contributes Σℓ/4; metrics are shares too
    outputs = {CHOSEN_REWARDS: torch.tensor([1.0, 0.0]), REJECTED_REWARDS: torch.tensor([0.0, 0.5])}
    loss, metrics = rm_loss(outputs, None, batch_num_pairs=4)
    assert float(loss) == pytest.approx((math.log(1 + math.exp(-1)) + math.log(1 + math.exp(0.5))) / 4, abs=1e-6)
    assert float(metrics["accuracy"]) == 0.25 and float(metrics["margin"]) == pytest.approx(0.5 / 4)


def test_accumulated_micro_batches_give_the_one_big_batch_gradient(pair_file):
    model, tokenizer = reward_model_from_lm("tiny-llama", seed=3)
    batch = to_tensordict(collate_fn([PairDataset(pair_file, tokenizer, max_length=128)[i] for i in range(8)]))
    grads = []
    for size in (8, 3, 1):
        engine = TorchEngine(copy.deepcopy(model), lr=1e-3)
        loss_fn = lambda out, micro: rm_loss(out, micro, batch_num_pairs=8)  # noqa: E731
        metrics = engine.forward_backward(batch, pair_rewards, loss_fn, MicroBatchSpec(size=size))
        assert len(metrics) == math.ceil(8 / size)
        grads.append(
            ({n: p.grad.clone() for n, p in engine.module.named_parameters()}, sum(float(m["loss"]) for m in metrics))
        )
    (whole, whole_loss), *splits = grads
    for split, split_loss in splits:
        assert_close_across(
            split_loss,
            whole_loss,
            dtype=torch.float32,
            reduction_size=TINY_WIDTH,
            depth=TINY_DEPTH,
            what="loss of the split batch",
        )
        for name, grad in whole.items():  # equal up to float32 summation order
            torch.testing.assert_close(split[name], grad, rtol=1e-4, atol=1e-5 * float(grad.abs().max()))
    # each side runs at its own length: padding past a row changes nothing
    with torch.no_grad():
        rewards = pair_rewards(model, batch)
        for i in (0, 5):
            n = int(batch["chosen_attention_mask"][i].sum())
            alone = last_token_scores(
                model, batch["chosen_input_ids"][i : i + 1, :n], torch.ones(1, n, dtype=torch.long)
            )
            assert float(rewards[CHOSEN_REWARDS][i]) == pytest.approx(float(alone), abs=1e-5)


def test_training_raises_validation_accuracy(pair_file, tmp_path):
    _fit(
        _config(
            pair_file, tmp_path, "trainer.total_training_steps=40", "trainer.test_freq=20", "trainer.export_hf=false"
        )
    )
    rows = _metrics(tmp_path)
    assert [r["step"] for r in rows] == list(range(41))  # step 0: validation before training
    val = [r for r in rows if "val/accuracy" in r]
    assert [r["step"] for r in val] == [0, 20, 40]
    start, end = val[0], val[-1]
    assert start["val/loss"] == pytest.approx(math.log(2), abs=0.01)  # a fresh head: r ≈ 0 for every reply
    assert end["val/accuracy"] >= max(0.75, start["val/accuracy"] + 0.3)
    assert end["val/loss"] < 0.6 * start["val/loss"] and end["val/margin"] > 0.5
    for key in ("train/loss", "train/accuracy", "train/margin", "train/lr", "train/grad_norm", "timing_s/step"):
        assert all(key in r for r in rows[1:]), key
    assert rows[1]["train/lr"] == 2e-3


def test_stop_and_resume_equals_an_uninterrupted_run(pair_file, tmp_path):
    # 32 pairs / 8 per step: step 5 is a second epoch; cosine lr with warm-up; 2 micro-batches per step
    extra = (
        "trainer.total_training_steps=6",
        "trainer.save_freq=3",
        "trainer.test_freq=3",
        "optim.lr_warmup_steps=2",
        "optim.lr_scheduler_type=cosine",
        "trainer.export_hf=false",
    )
    uninterrupted = _fit(_config(pair_file, tmp_path / "a", *extra))
    crashed = build_rm_trainer(_config(pair_file, tmp_path / "b", *extra))
    crashed.tracking = CrashAt(crashed.tracking, step=5)
    with pytest.raises(RuntimeError, match="simulated crash"):
        crashed.fit()
    crashed.tracking.finish()
    assert (tmp_path / "b" / LATEST_FILE).read_text() == "3"
    resumed = _fit(_config(pair_file, tmp_path / "b", *extra))
    assert resumed.global_step == uninterrupted.global_step == 6
    # bitwise by construction: both runs in this process with the same kernels (exact resume)
    a, b = uninterrupted.engine.module.state_dict(), resumed.engine.module.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    keys = ("train/loss", "train/accuracy", "train/lr", "train/grad_norm", "val/loss", "val/accuracy")
    rows_a, rows_b = _metrics(tmp_path / "a"), _metrics(tmp_path / "b")
    assert [r["step"] for r in rows_b] == list(range(7))
    assert [[r.get(k) for k in keys] for r in rows_a] == [[r.get(k) for k in keys] for r in rows_b]


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_exported_folder_scores_like_the_trained_model(pair_file, tmp_path, lora):
    extra = ["trainer.total_training_steps=2", "trainer.val_before_train=false"]
    if lora:
        extra += ["model.lora_rank=4", "model.lora_alpha=8", "optim.lr=1e-2"]
    trainer = _fit(_config(pair_file, tmp_path, *extra))
    step = tmp_path / "global_step_2"
    assert sorted(p.name for p in step.iterdir()) == sorted(
        ["checkpoint_manifest.json", "controller_state.json", HF_FOLDER, MODEL_DIR]
    )
    trained = trainer.engine.module
    if lora:  # only the adapters and the head (peft's trainable copy of it) train
        trainable = [n for n, p in trained.named_parameters() if p.requires_grad]
        assert all("lora_" in n or "score.modules_to_save" in n for n in trainable)
        assert any("score.modules_to_save" in n for n in trainable) and any("lora_B" in n for n in trainable)
    model, tokenizer = load_reward_model(step / HF_FOLDER)
    assert model.config.architectures == ["LlamaForSequenceClassification"] and model.config.num_labels == 1
    assert tokenizer.chat_template == trainer.tokenizer.chat_template
    batch = to_tensordict(collate_fn([trainer.val_loader.dataset[i] for i in range(6)]))
    trained.eval()
    with torch.no_grad():
        expected, got = pair_rewards(trained, batch), pair_rewards(model, batch)
    for key in (CHOSEN_REWARDS, REJECTED_REWARDS):
        torch.testing.assert_close(got[key], expected[key], rtol=1e-4, atol=1e-5)
    assert expected[CHOSEN_REWARDS].abs().max() > 1e-3  # not a trivially zero head


@pytest.mark.parametrize(
    "override, message",
    [
        ("data.response_key=x", "data.response_key"),
        ("data.rejected_key=chosen", "data.chosen_key and data.rejected_key are both 'chosen'"),
        ("model.use_remove_padding=true", "not for reward models"),
        ("trainer.nnodes=2", "the reward-model trainer runs in one process"),
        ("data.truncation=right", "data.truncation"),
        ("trainer.resume_mode=resume_path", "trainer.resume_from_path must be set"),
    ],
)
def test_bad_keys_are_refused(override, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_rm_config(None, [override])


def test_every_key_is_read_by_the_trainer():
    sources = " ".join(
        (ROOT / "hybridflow" / f).read_text()
        for f in (
            "entrypoints/rm.py",
            "trainer/supervised/rm_trainer.py",
            "trainer/supervised/base.py",
            "config/rm_rules.py",
            "config/sft_rules.py",
            "workers/engine_factory.py",
        )
    )
    unread = [path for path, _, _ in iter_leaves(RMConfig) if f".{path.rpartition('.')[2]}" not in sources]
    assert unread == []


def test_docs_key_table_is_current():
    doc = RM_DOC.read_text(encoding="utf-8")
    assert fill_regions(doc, RM_DOC_REGIONS, RM_DOC) == doc, (
        "docs/reward_models.md's key table is stale: run python -m hybridflow.config.generate"
    )


def test_cli_help_and_bad_input_exit_codes(pair_file, tmp_path, capsys):
    from hybridflow.cli import main as cli_main

    with pytest.raises(SystemExit) as done:
        cli_main(["rm", "--help"])
    assert done.value.code == 0 and "hybridflow rm" in capsys.readouterr().out
    assert main(["trainer.nnodes=2"]) == 2
    assert "the reward-model trainer runs in one process" in capsys.readouterr().err
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "What is 1 + 1?", "chosen": "2"}\n')
    assert (
        main(
            [
                "model.path=tiny-llama",
                f"data.train_files=[{bad}]",
                "data.val_files=[]",
                f"trainer.default_local_dir={tmp_path / 'run'}",
            ]
        )
        == 2
    )
    assert f"hybridflow rm: {bad}: row 0: field 'rejected': missing column" in capsys.readouterr().err
    assert main(["model.path=tiny-llama", f"data.train_files=[{tmp_path / 'none.parquet'}]"]) == 2
    assert "data.train_files" in capsys.readouterr().err
