"""Export of a vision-language actor checkpoint (tiny Qwen2-VL): ``merge`` rebuilds the
conditional-generation class from the checkpoint's config and ``test`` loads VLM folders, both
through ``AutoModelForImageTextToText`` — no ``AutoModelForCausalLM`` registration of Qwen2-VL."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, Qwen2VLConfig

from hybridflow.config import load_config
from hybridflow.entrypoints.export import main as export_main
from hybridflow.export.compare import folder_state_dict
from hybridflow.export.reader import build_model, locate_checkpoint
from hybridflow.export.writer import merge_checkpoint
from hybridflow.models.processor import load_processor
from hybridflow.models.tiny_vlm import save_tiny_vlm
from hybridflow.workers.actor import ActorWorker

MOVED = "model.visual.blocks.0.mlp.fc1.weight"  # a vision-tower weight the "training" changes
MOVED_IN_FILE = "visual.blocks.0.mlp.fc1.weight"  # its name in a saved folder (transformers' file layout)


@pytest.fixture(scope="module")
def vlm_run(tmp_path_factory) -> tuple[Path, Path]:
    """(base folder, actor checkpoint) where the checkpoint's vision tower differs from the base."""
    base = save_tiny_vlm(tmp_path_factory.mktemp("vlm") / "tiny-qwen2-vl")
    cfg = load_config(None, [f"actor_rollout_ref.model.path={base}", "actor_rollout_ref.model.dtype=fp32"])
    worker = ActorWorker(cfg.actor_rollout_ref, share_name=None)
    worker.init_model()
    with torch.no_grad():
        worker.module.get_parameter(MOVED).add_(0.5)
    actor = tmp_path_factory.mktemp("run") / "global_step_1" / "actor"
    worker.save_checkpoint(str(actor))
    return base, actor


def test_no_causal_lm_registration_is_left(vlm_run) -> None:
    # importing the tiny VLM (done above) no longer registers Qwen2-VL under AutoModelForCausalLM
    with pytest.raises(ValueError, match="Unrecognized configuration class"):
        AutoModelForCausalLM.from_config(Qwen2VLConfig())


def test_merge_rebuilds_the_conditional_generation_model(vlm_run, tmp_path) -> None:
    base, actor = vlm_run
    model = build_model(locate_checkpoint(actor))
    assert type(model).__name__ == "Qwen2VLForConditionalGeneration"
    out = merge_checkpoint(actor, tmp_path / "hf")
    assert load_processor(out) is not None
    merged, start = load_file(str(out / "model.safetensors")), load_file(str(base / "model.safetensors"))
    assert merged.keys() == start.keys()
    assert torch.equal(merged[MOVED_IN_FILE], start[MOVED_IN_FILE] + 0.5)
    assert all(torch.equal(merged[k], start[k]) for k in start if k != MOVED_IN_FILE)


def test_export_test_compares_vlm_folders_and_checkpoints(vlm_run, tmp_path, capsys) -> None:
    base, actor = vlm_run
    out = merge_checkpoint(actor, tmp_path / "hf")
    assert any(name.startswith("model.visual.") for name in folder_state_dict(out))
    assert export_main(["test", "--local_dir", str(actor), "--test_hf_dir", str(out)]) == 0
    assert "OK: " in capsys.readouterr().out
    assert export_main(["test", "--local_dir", str(out), "--test_hf_dir", str(base)]) == 1
    report = capsys.readouterr().out
    assert f"values differ: {MOVED}" in report and report.count("values differ") == 1
