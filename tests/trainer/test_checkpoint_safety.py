"""A checkpoint is data, never code: a pickle planted in any state file of a run folder is
refused on every resume path — ``trainer.resume_mode=auto``, ``resume_path``, ``hybridflow sft``
— and the command it carries never runs. Old-format checkpoints (``data.pt``) load only through
the explicit upgrade command, which also refuses anything but plain data."""

from __future__ import annotations

import json
import pickle
import random
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from hybridflow.config import load_config, load_sft_config
from hybridflow.controller import WorkerError
from hybridflow.data import write_rows
from hybridflow.data.tasks import ArithmeticSettings, generate_arithmetic
from hybridflow.data.tasks.arithmetic_sft import add_responses
from hybridflow.engine.checkpoint import CheckpointFileError
from hybridflow.entrypoints.sft import build_sft_trainer
from hybridflow.entrypoints.sft import main as sft_main
from hybridflow.entrypoints.train import build_trainer
from hybridflow.trainer import checkpoint as ckpt
from hybridflow.trainer import checkpoint_upgrade

from ..engine.test_checkpoint_safety import Payload, plant
from .conftest import tiny_overrides

PPO_STATE_FILES = ["controller_state.json", "actor/optimizer.pt", "actor/extra_state.pt", "actor/shuffle_rng_rank_0.pt"]


def _ppo_config(task_dir, run_dir, model_dir, *extra):
    return load_config(None, tiny_overrides(task_dir, run_dir, model_dir, "data.val_files=[]", *extra))


@pytest.fixture(scope="module")
def ppo_run(tiny_task_dir, tiny_model_dir, tmp_path_factory) -> Path:
    """A run folder with one checkpoint, global_step_1."""
    run_dir = tmp_path_factory.mktemp("ppo") / "run"
    trainer = build_trainer(_ppo_config(tiny_task_dir, run_dir, tiny_model_dir, "trainer.total_training_steps=1",
                                        "trainer.save_freq=1"))
    try:
        trainer.fit()
    finally:
        trainer.close()
    return run_dir


def _copy(run_dir: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(run_dir, tmp_path / "run"))


def _plant_state(step_dir: Path, name: str, marker: Path) -> None:
    """Replace one state file with the payload and re-seal the manifest, as an attacker who
    controls the folder would: only the loader stands between the file and its execution."""
    if name.endswith(".json"):
        (step_dir / name).write_bytes(pickle.dumps(Payload(marker)))
    else:
        plant(step_dir / name, marker)
    ckpt.write_manifest(step_dir, ckpt.step_of(step_dir))


def _resume_ppo(config) -> None:
    trainer = build_trainer(config)
    try:
        trainer.fit()
    finally:
        trainer.close()


@pytest.mark.parametrize("mode", ["auto", "resume_path"])
@pytest.mark.parametrize("name", PPO_STATE_FILES)
def test_ppo_resume_refuses_a_planted_state_file(name, mode, ppo_run, tiny_task_dir, tiny_model_dir, tmp_path):
    run_dir, marker = _copy(ppo_run, tmp_path), tmp_path / "ran"
    _plant_state(run_dir / "global_step_1", name, marker)
    extra = ["trainer.total_training_steps=2", f"trainer.resume_mode={mode}"]
    if mode == "resume_path":
        extra.append(f"trainer.resume_from_path={run_dir / 'global_step_1'}")
    with pytest.raises((ckpt.CheckpointError, CheckpointFileError, WorkerError)) as info:
        _resume_ppo(_ppo_config(tiny_task_dir, run_dir, tiny_model_dir, *extra))
    assert f"global_step_1/{name}" in str(info.value)
    assert not marker.exists()


def _legacy_state(step_dir: Path) -> dict:
    """The controller state as the old code pickled it into data.pt (numpy array, tuples, tensor)."""
    state = json.loads((step_dir / ckpt.CONTROLLER_STATE).read_text())
    rng = state.pop("rng")
    for key in ("format", "version"):
        state.pop(key)
    state["rng"] = {
        "python": (rng["python"]["version"], tuple(rng["python"]["state"]), rng["python"]["gauss_next"]),
        "numpy": (rng["numpy"]["kind"], np.array(rng["numpy"]["keys"], dtype=np.uint32), rng["numpy"]["pos"],
                  rng["numpy"]["has_gauss"], rng["numpy"]["cached_gaussian"]),
        "torch": torch.tensor(list(bytes.fromhex(rng["torch"])), dtype=torch.uint8),
    }
    return state


def _make_legacy(step_dir: Path, payload: object) -> None:
    (step_dir / ckpt.CONTROLLER_STATE).unlink()
    (step_dir / ckpt.MANIFEST_FILE).unlink()
    torch.save(payload, step_dir / ckpt.LEGACY_CONTROLLER_STATE)


def test_old_format_needs_the_upgrade_command_then_resumes(ppo_run, tiny_task_dir, tiny_model_dir, tmp_path):
    run_dir = _copy(ppo_run, tmp_path)
    step = run_dir / "global_step_1"
    expected_rng = json.loads((step / ckpt.CONTROLLER_STATE).read_text())["rng"]
    _make_legacy(step, _legacy_state(step))
    config = _ppo_config(tiny_task_dir, run_dir, tiny_model_dir, "trainer.total_training_steps=2")
    with pytest.raises(ckpt.LegacyCheckpointError, match="python -m hybridflow.trainer.checkpoint_upgrade"):
        _resume_ppo(config)
    assert checkpoint_upgrade.main([str(run_dir)]) == 0
    assert (step / ckpt.LEGACY_CONTROLLER_STATE).is_file()  # kept: nothing of the user's is deleted
    assert json.loads((step / ckpt.CONTROLLER_STATE).read_text())["rng"] == expected_rng
    trainer = build_trainer(config)
    try:
        trainer.load_checkpoint()
        assert trainer.global_steps == 1
        assert ckpt.rng_state() == expected_rng
    finally:
        trainer.close()


def test_upgrade_refuses_a_planted_old_format_file(ppo_run, tmp_path, capsys):
    run_dir, marker = _copy(ppo_run, tmp_path), tmp_path / "ran"
    step = run_dir / "global_step_1"
    _make_legacy(step, {"global_steps": 1, "rng": Payload(marker)})
    with pytest.raises(ckpt.LegacyCheckpointError):
        ckpt.find_resume_checkpoint(run_dir, "auto", None)
    assert checkpoint_upgrade.main([str(step)]) == 2
    assert "data.pt: refused or unreadable, not converted" in capsys.readouterr().err
    assert not marker.exists() and not (step / ckpt.CONTROLLER_STATE).exists()


# ------------------------------------------------------------------------------ hybridflow sft
@pytest.fixture(scope="module")
def sft_run(tiny_model_dir, tmp_path_factory) -> tuple[list[str], Path]:
    """``hybridflow sft`` arguments and the run folder they wrote one checkpoint (step 1) into."""
    root = tmp_path_factory.mktemp("sft")
    train, _ = generate_arithmetic(8, 0, seed=0, settings=ArithmeticSettings(min_value=0, max_value=9))
    train_file = write_rows(add_responses(train), root / "train.parquet")
    run_dir = root / "run"
    args = [f"model.path={tiny_model_dir}", f"data.train_files=[{train_file}]", "data.val_files=[]",
            "data.max_length=96", "data.train_batch_size=4", "data.micro_batch_size_per_gpu=4",
            f"trainer.default_local_dir={run_dir}", "trainer.logger=[jsonl]", "trainer.export_hf=false"]
    trainer = build_sft_trainer(load_sft_config(None, [*args, "trainer.total_training_steps=1"]))
    try:
        trainer.fit()
    finally:
        trainer.tracking.finish()
    return args, run_dir


@pytest.mark.parametrize("name", ["controller_state.json", "actor/optimizer.pt", "actor/extra_state.pt", "data.pt"])
def test_sft_resume_refuses_a_planted_state_file(name, sft_run, tmp_path, capsys):
    args, original = sft_run
    run_dir, marker = _copy(original, tmp_path), tmp_path / "ran"
    step = run_dir / "global_step_1"
    if name == "data.pt":
        _make_legacy(step, {"kind": "sft", "global_steps": 1, "rng": Payload(marker)})
    else:
        _plant_state(step, name, marker)
    args = [a.replace(str(original), str(run_dir)) for a in args] + ["trainer.total_training_steps=2"]
    assert sft_main(args) == 2
    assert f"global_step_1/{name}" in capsys.readouterr().err
    assert not marker.exists()


def test_json_state_cannot_smuggle_objects(tmp_path):
    # JSON has no way to name a callable; what the loader returns is only dicts, lists and scalars
    root = tmp_path / "global_step_1"
    root.mkdir()
    ckpt.save_controller_state(root / ckpt.CONTROLLER_STATE, {"global_steps": 1, "rng": ckpt.rng_state()})
    state = ckpt.load_controller_state(root)

    def plain(value) -> bool:
        if isinstance(value, dict):
            return all(isinstance(k, str) and plain(v) for k, v in value.items())
        if isinstance(value, list):
            return all(plain(v) for v in value)
        return value is None or isinstance(value, (str, int, float, bool))

    assert plain(state)
    with pytest.raises(TypeError, match="plain JSON values"):
        ckpt.save_controller_state(root / ckpt.CONTROLLER_STATE, {"global_steps": 1, "x": random.Random()})
