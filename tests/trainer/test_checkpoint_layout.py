import json

import pytest

from hybridflow.trainer import checkpoint as ckpt


def _save(root, step, keep=None):
    paths = ckpt.begin_checkpoint(root, step)
    paths.actor.mkdir()
    (paths.actor / "model.safetensors").write_bytes(b"x" * 10)
    ckpt.save_controller_state(paths.controller_state, {"global_steps": step})
    ckpt.commit_checkpoint(paths, step, keep)
    return paths.root


def test_layout_and_latest(tmp_path):
    root = _save(tmp_path, 3)
    assert root == tmp_path / "global_step_3"
    assert (root / "actor" / "model.safetensors").is_file()
    assert sorted(p.name for p in root.iterdir()) == ["actor", ckpt.MANIFEST_FILE, ckpt.CONTROLLER_STATE]
    manifest = json.loads((root / ckpt.MANIFEST_FILE).read_text())
    assert manifest["step"] == 3
    assert manifest["files"] == {"actor/model.safetensors": 10, ckpt.CONTROLLER_STATE: (root / ckpt.CONTROLLER_STATE).stat().st_size}
    assert (tmp_path / "latest_checkpointed_iteration.txt").read_text() == "3"
    assert ckpt.find_resume_checkpoint(tmp_path, "auto", None) == root
    state = ckpt.load_controller_state(root)
    assert state["global_steps"] == 3 and state["format"] == ckpt.CHECKPOINT_FORMAT


def test_partial_checkpoint_is_never_resumed(tmp_path):
    _save(tmp_path, 2)
    paths = ckpt.begin_checkpoint(tmp_path, 4)  # crash: never committed
    (paths.actor).mkdir()
    assert ckpt.find_resume_checkpoint(tmp_path, "auto", None) == tmp_path / "global_step_2"
    assert [s for s, _ in ckpt.list_checkpoints(tmp_path)] == [2]


def test_retention_keeps_newest(tmp_path):
    for step in (1, 2, 3, 4):
        _save(tmp_path, step, keep=2)
    assert [s for s, _ in ckpt.list_checkpoints(tmp_path)] == [3, 4]


def test_retention_ignores_steps_after_the_one_saved(tmp_path):
    # resumed from step 2 past a damaged step 4: saving step 3 must not prune step 2 for step 4
    for step in (2, 4):
        _save(tmp_path, step)
    _save(tmp_path, 3, keep=2)
    assert [s for s, _ in ckpt.list_checkpoints(tmp_path)] == [2, 3, 4]


def test_resume_modes(tmp_path):
    root = _save(tmp_path, 5)
    assert ckpt.find_resume_checkpoint(tmp_path, "disable", None) is None
    assert ckpt.find_resume_checkpoint(tmp_path, "resume_path", str(root)) == root
    assert ckpt.find_resume_checkpoint(tmp_path / "empty", "auto", None) is None
    with pytest.raises(ValueError, match="resume_from_path"):
        ckpt.find_resume_checkpoint(tmp_path, "resume_path", None)
    with pytest.raises(ValueError, match="not a complete"):
        ckpt.find_resume_checkpoint(tmp_path, "resume_path", str(tmp_path))
    with pytest.raises(ValueError, match="resume_mode"):
        ckpt.find_resume_checkpoint(tmp_path, "sometimes", None)


def test_damaged_newest_checkpoint_falls_back_and_says_so(tmp_path, capsys):
    _save(tmp_path, 2)
    newest = _save(tmp_path, 4)
    (newest / "actor" / "model.safetensors").write_bytes(b"x" * 3)  # truncated
    assert ckpt.find_resume_checkpoint(tmp_path, "auto", None) == tmp_path / "global_step_2"
    out = capsys.readouterr().out
    assert "global_step_4/actor/model.safetensors is damaged: 3 bytes, 10 when it was saved" in out
    assert "Resuming from" in out and "global_step_2" in out
    with pytest.raises(ckpt.CheckpointError, match="model.safetensors is damaged"):
        ckpt.find_resume_checkpoint(tmp_path, "resume_path", str(newest))  # an explicit path never falls back
    (newest / "actor" / "model.safetensors").unlink()
    assert ckpt.find_resume_checkpoint(tmp_path, "auto", None) == tmp_path / "global_step_2"
    assert "model.safetensors is missing" in capsys.readouterr().out


def test_no_complete_checkpoint_is_an_error_naming_each_damage(tmp_path):
    only = _save(tmp_path, 1)
    (only / ckpt.CONTROLLER_STATE).write_text("{}")
    with pytest.raises(ckpt.CheckpointError, match="no complete checkpoint .*controller_state.json is damaged"):
        ckpt.find_resume_checkpoint(tmp_path, "auto", None)


def test_latest_file_is_only_a_pointer(tmp_path):
    # a crash between the folder's rename and the latest file's write: the folder is complete
    root = _save(tmp_path, 1)
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("abc")
    assert ckpt.find_resume_checkpoint(tmp_path, "auto", None) == root


def test_corrupt_controller_state_is_named(tmp_path):
    root = _save(tmp_path, 1)
    (root / ckpt.CONTROLLER_STATE).write_text('{"format": "hybridflow-checkpoint", "global_st')
    with pytest.raises(ckpt.CheckpointError, match="controller_state.json"):
        ckpt.load_controller_state(root)
    (root / ckpt.CONTROLLER_STATE).write_text('{"format": "hybridflow-checkpoint", "global_steps": -1}')
    with pytest.raises(ckpt.CheckpointError, match="global_steps must be a non-negative integer"):
        ckpt.load_controller_state(root)
    (root / ckpt.CONTROLLER_STATE).write_text('{"format": "hybridflow-checkpoint", "global_steps": 1}')
    with pytest.raises(ckpt.CheckpointError, match="controller_state.json lacks dataloader"):
        ckpt.load_controller_state(root, required=("global_steps", "dataloader"))
    state = {"rng": {"python": [1, 2]}}
    with pytest.raises(ckpt.CheckpointError, match="controller_state.json: entry 'rng' cannot be restored"):
        ckpt.restore_entry(root, state, "rng", ckpt.set_rng_state)


def test_rng_round_trip_through_json():
    import random

    import numpy as np
    import torch

    np.random.randn()  # a cached Gaussian must survive too
    state = json.loads(json.dumps(ckpt.rng_state()))
    a = (random.random(), np.random.rand(), np.random.randn(), torch.rand(1).item())
    ckpt.set_rng_state(state)
    assert (random.random(), np.random.rand(), np.random.randn(), torch.rand(1).item()) == a
