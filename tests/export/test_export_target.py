"""``hybridflow export merge`` never deletes the user's data: a non-empty target it did not
create is refused unless ``--overwrite``, and even then only the export's own files are written."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from hybridflow.engine import TorchEngine
from hybridflow.entrypoints.export import main as export_main
from hybridflow.export.reader import CheckpointError
from hybridflow.export.writer import EXPORT_MANIFEST, merge_checkpoint
from hybridflow.trainer.checkpoint import LATEST_FILE


@pytest.fixture(scope="module")
def run_template(tiny_model_dir, tmp_path_factory) -> Path:
    """A run folder as training leaves it: a checkpoint, metrics, curves, the user's own notes."""
    run = tmp_path_factory.mktemp("runs") / "x"
    module = AutoModelForCausalLM.from_pretrained(tiny_model_dir, local_files_only=True)
    TorchEngine(module, lr=1e-3).save_checkpoint(run / "global_step_2" / "actor")
    (run / LATEST_FILE).write_text("2")
    (run / "metrics.jsonl").write_text('{"step": 1}\n{"step": 2}\n')
    (run / "curves.png").write_bytes(b"\x89PNG fake")
    (run / "notes.txt").write_text("the user's own file")
    return run


@pytest.fixture
def run_dir(run_template, tmp_path) -> Path:
    return Path(shutil.copytree(run_template, tmp_path / "runs" / "x"))


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _merge_args(local: Path, target: Path, model_dir: Path, *extra: str) -> list[str]:
    return ["merge", "--local_dir", str(local), "--target_dir", str(target), "--hf_model_config_path", str(model_dir), *extra]


def test_export_into_the_run_folder_is_refused_and_changes_nothing(run_dir, tiny_model_dir, capsys):
    before = _snapshot(run_dir)
    assert export_main(_merge_args(run_dir / "global_step_2", run_dir, tiny_model_dir)) == 2
    err = capsys.readouterr().err
    assert f"target_dir {run_dir} is not empty" in err and "--overwrite" in err and "notes.txt" in err
    assert _snapshot(run_dir) == before
    assert sorted(p.name for p in run_dir.parent.iterdir()) == ["x"]  # no temporary folder left behind


def test_overwrite_writes_the_export_in_and_removes_nothing(run_dir, tiny_model_dir):
    before = _snapshot(run_dir)
    assert export_main(_merge_args(run_dir / "global_step_2", run_dir, tiny_model_dir, "--overwrite")) == 0
    after = _snapshot(run_dir)
    assert all(after[name] == data for name, data in before.items())  # every file of the run, unchanged
    listed = json.loads((run_dir / EXPORT_MANIFEST).read_text())["files"]
    assert {"model.safetensors", "config.json", "tokenizer.json"} <= set(listed)
    assert set(after) == set(before) | set(listed) | {EXPORT_MANIFEST}
    assert AutoModelForCausalLM.from_pretrained(run_dir, local_files_only=True).config.num_hidden_layers == 2


def test_a_new_export_replaces_only_what_the_last_one_wrote(run_dir, tiny_model_dir, tmp_path):
    out = tmp_path / "hf"
    merge_checkpoint(run_dir, out, hf_model_config_path=tiny_model_dir)
    fp32_size = (out / "model.safetensors").stat().st_size
    (out / "README.md").write_text("written by the user")
    manifest = json.loads((out / EXPORT_MANIFEST).read_text())
    (out / "model-00002-of-00002.safetensors").write_bytes(b"a shard an earlier export wrote")
    manifest["files"].append("model-00002-of-00002.safetensors")
    manifest["sha256"]["model-00002-of-00002.safetensors"] = hashlib.sha256(b"a shard an earlier export wrote").hexdigest()
    (out / EXPORT_MANIFEST).write_text(json.dumps(manifest))

    merge_checkpoint(run_dir, out, hf_model_config_path=tiny_model_dir, dtype="bf16")  # no overwrite needed
    assert (out / "README.md").read_text() == "written by the user"
    assert not (out / "model-00002-of-00002.safetensors").exists()  # listed by the earlier export: its own
    assert (out / "model.safetensors").stat().st_size < fp32_size
    assert AutoModelForCausalLM.from_pretrained(out, local_files_only=True).dtype == torch.bfloat16


def test_an_empty_existing_folder_is_used(run_dir, tiny_model_dir, tmp_path):
    (tmp_path / "empty").mkdir()
    out = merge_checkpoint(run_dir, tmp_path / "empty", hf_model_config_path=tiny_model_dir)
    assert (out / "model.safetensors").is_file()


def test_a_target_inside_the_checkpoint_is_refused_even_with_overwrite(run_dir, tiny_model_dir):
    actor = run_dir / "global_step_2" / "actor"
    before = _snapshot(run_dir)
    for target in (actor, actor / "hf"):
        with pytest.raises(CheckpointError, match="inside the checkpoint being exported"):
            merge_checkpoint(actor, target, hf_model_config_path=tiny_model_dir, overwrite=True)
    assert _snapshot(run_dir) == before


def test_a_manifest_naming_files_outside_the_target_is_refused(run_dir, tiny_model_dir, tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    out = tmp_path / "out"
    out.mkdir()
    (out / EXPORT_MANIFEST).write_text(json.dumps({"files": ["../victim.txt"]}))
    with pytest.raises(CheckpointError, match="lists names outside the folder"):
        merge_checkpoint(run_dir, out, hf_model_config_path=tiny_model_dir)
    assert victim.read_text() == "keep me"
