import pytest

from hybridflow.trainer import checkpoint as ckpt


def _save(root, step, keep=None):
    paths = ckpt.begin_checkpoint(root, step)
    paths.actor.mkdir()
    (paths.actor / "model.safetensors").write_bytes(b"x")
    ckpt.save_controller_state(paths.controller_state, {"global_steps": step})
    ckpt.commit_checkpoint(paths, step, keep)
    return paths.root


def test_layout_and_latest(tmp_path):
    root = _save(tmp_path, 3)
    assert root == tmp_path / "global_step_3"
    assert (root / "actor" / "model.safetensors").is_file()
    assert (root / "data.pt").is_file()
    assert (tmp_path / "latest_checkpointed_iteration.txt").read_text() == "3"
    assert ckpt.find_resume_checkpoint(tmp_path, "auto", None) == root
    assert ckpt.load_controller_state(root) == {"global_steps": 3}


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


def test_corrupt_files_are_named(tmp_path):
    root = _save(tmp_path, 1)
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("abc")
    with pytest.raises(ValueError, match="corrupt"):
        ckpt.find_resume_checkpoint(tmp_path, "auto", None)
    (root / "data.pt").write_bytes(b"not a torch file")
    with pytest.raises(ValueError, match="data.pt"):
        ckpt.load_controller_state(root)


def test_rng_round_trip():
    import random

    import numpy as np
    import torch

    state = ckpt.rng_state()
    a = (random.random(), np.random.rand(), torch.rand(1).item())
    ckpt.set_rng_state(state)
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == a
