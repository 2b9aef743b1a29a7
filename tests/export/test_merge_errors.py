"""Model merger: clear errors for missing / corrupt / mismatched checkpoints; the comparison."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from hybridflow.engine import TorchEngine
from hybridflow.engine.checkpoint import MODEL_FILE
from hybridflow.entrypoints.export import main as export_main
from hybridflow.export.compare import compare_state_dicts, format_comparison
from hybridflow.export.reader import (
    CHECKPOINT_READERS,
    CheckpointError,
    locate_checkpoint,
)
from hybridflow.export.writer import merge_checkpoint
from hybridflow.models import load_model_and_tokenizer
from hybridflow.models.tiny import save_tiny_model
from hybridflow.trainer.checkpoint import LATEST_FILE


@pytest.fixture(scope="module")
def bare_checkpoint(tiny_model_dir, tmp_path_factory) -> tuple[Path, torch.nn.Module]:
    """A TorchEngine checkpoint written directly: weights only, no hf_config/ or tokenizer/."""
    module = AutoModelForCausalLM.from_pretrained(tiny_model_dir, local_files_only=True)
    with torch.no_grad():
        module.model.norm.weight.add_(0.5)  # differ from the starting model
    path = tmp_path_factory.mktemp("bare") / "actor"
    TorchEngine(module, lr=1e-3).save_checkpoint(path)
    return path, module


def test_checkpoint_without_hf_config_needs_the_base_model_folder(bare_checkpoint, tiny_model_dir, tmp_path):
    path, module = bare_checkpoint
    with pytest.raises(CheckpointError, match="no hf_config/config.json.*--hf_model_config_path"):
        merge_checkpoint(path, tmp_path / "out")
    out = merge_checkpoint(path, tmp_path / "out", hf_model_config_path=tiny_model_dir)
    assert (out / "tokenizer.json").is_file()  # the tokenizer came from the base folder too
    reloaded = AutoModelForCausalLM.from_pretrained(out, local_files_only=True)
    ids = torch.tensor([[5, 17, 42, 99]])
    with torch.no_grad():
        assert torch.equal(reloaded(ids).logits, module(ids).logits)


def test_missing_and_corrupt_checkpoints_are_named(bare_checkpoint, tiny_model_dir, tmp_path):
    with pytest.raises(CheckpointError, match="does not exist"):
        merge_checkpoint(tmp_path / "nowhere", tmp_path / "out")
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "notes.txt").write_text("x")
    with pytest.raises(CheckpointError, match=r"not an engine checkpoint folder \(found: notes.txt\)"):
        merge_checkpoint(empty, tmp_path / "out")
    truncated = tmp_path / "truncated"
    truncated.mkdir()
    data = (bare_checkpoint[0] / MODEL_FILE).read_bytes()
    (truncated / MODEL_FILE).write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="corrupt or truncated"):
        merge_checkpoint(truncated, tmp_path / "out", hf_model_config_path=tiny_model_dir)
    assert not (tmp_path / "out").exists()  # nothing half-written
    run = tmp_path / "run"
    run.mkdir()
    (run / LATEST_FILE).write_text("seven")
    with pytest.raises(CheckpointError, match="corrupt: expected a step number"):
        merge_checkpoint(run, tmp_path / "out")


def test_weights_that_do_not_fit_the_config_are_listed(bare_checkpoint, tmp_path):
    other = save_tiny_model(tmp_path / "wide", hidden_size=64)
    expected = r"do not fit the model config: shape mismatch, checkpoint vs config \(20\): lm_head.weight \(512, 128\) vs \(512, 64\)"
    with pytest.raises(CheckpointError, match=expected):
        merge_checkpoint(bare_checkpoint[0], tmp_path / "out", hf_model_config_path=other)
    deeper = save_tiny_model(tmp_path / "deep", num_layers=3)
    with pytest.raises(CheckpointError, match=r"missing \(\d+\): model.layers.2."):
        merge_checkpoint(bare_checkpoint[0], tmp_path / "out", hf_model_config_path=deeper)


def test_lora_weights_without_adapter_config_and_adapter_export_of_a_plain_model(bare_checkpoint, tiny_model_dir, tmp_path):
    module, _ = load_model_and_tokenizer(tiny_model_dir, lora_rank=2, lora_alpha=4)
    TorchEngine(module, lr=1e-3).save_checkpoint(tmp_path / "lora")
    with pytest.raises(CheckpointError, match="holds LoRA weights but .* has no adapter_config.json"):
        merge_checkpoint(tmp_path / "lora", tmp_path / "out", hf_model_config_path=tiny_model_dir)
    with pytest.raises(CheckpointError, match="was not trained with LoRA"):
        merge_checkpoint(bare_checkpoint[0], tmp_path / "out", hf_model_config_path=tiny_model_dir, lora="adapter")


def test_readers_registry_detection_and_sharded_folders(bare_checkpoint, tiny_model_dir, tmp_path):
    assert locate_checkpoint(bare_checkpoint[0], tiny_model_dir).backend == "torch"
    assert CHECKPOINT_READERS.meta("torch").detect(bare_checkpoint[0])
    with pytest.raises(ValueError, match="unknown checkpoint reader 'megatron'; valid names: .*torch"):
        locate_checkpoint(bare_checkpoint[0], tiny_model_dir, backend="megatron")
    sharded = tmp_path / "sharded"
    for rank in range(2):
        (sharded / f"rank_{rank}").mkdir(parents=True)
    with pytest.raises(CheckpointError, match=r"per-rank shards \(rank_\*/\) but no registered reader"):
        locate_checkpoint(sharded, tiny_model_dir)


def test_cli_reports_bad_input_with_status_2(tmp_path, capsys):
    assert export_main(["merge", "--local_dir", str(tmp_path / "nowhere"), "--target_dir", str(tmp_path / "o")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert export_main(["test", "--local_dir", str(tmp_path), "--test_hf_dir", str(tmp_path)]) == 2


def test_compare_state_dicts_by_hand():
    ref = {"a": torch.tensor([1.0, 2.0]), "b": torch.zeros(2, 2), "c": torch.ones(3), "d": torch.tensor([0.0])}
    cand = {"a": torch.tensor([1.0, 2.0 + 5e-7]), "b": torch.zeros(4), "c": torch.tensor([1.0, 1.0, 1.5]),
            "e": torch.tensor([0.0])}
    result = compare_state_dicts(cand, ref, atol=1e-6, rtol=0)
    assert (result.compared, result.missing, result.unexpected) == (3, ["d"], ["e"])
    assert result.shape_mismatch == ["b: (4,) vs (2, 2)"]
    assert result.value_mismatch == [("c", 0.5)] and not result.ok
    assert "values differ: c (max |diff| 0.5)" in format_comparison(result)
    same = compare_state_dicts({"a": torch.ones(2, dtype=torch.bfloat16)}, {"a": torch.ones(2)})
    assert same.ok and format_comparison(same) == "OK: 1 tensors match (names, shapes, values)"
