"""Engine checkpoints are data, never code: a pickle planted in any file that is read back is
refused with the file named, and the command it carries never runs; damaged files are named too."""

from __future__ import annotations

import io
import os
import pickle
from pathlib import Path

import pytest
import torch

from hybridflow.engine import FSDPEngine, TorchEngine
from hybridflow.engine.checkpoint import EXTRA_STATE_FILE, OPTIMIZER_FILE, CheckpointFileError, load_torch_data
from hybridflow.engine.fsdp_checkpoint import SafeLoadPlanner, extra_state_file, read_full_model_state
from hybridflow.models.tiny import build_tiny_model
from hybridflow.workers.ppo_loop import load_shuffle_state, save_shuffle_state, shuffle_state_file


class Payload:
    """Unpickling this runs ``touch marker`` — what a planted checkpoint file would do."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def plant(file: Path, marker: Path) -> None:
    torch.save({"state": Payload(marker)}, file)


def _trained_engine() -> TorchEngine:
    engine = TorchEngine(build_tiny_model(seed=0), lr=1e-2)
    for p in engine.module.parameters():
        p.grad = torch.ones_like(p)
    engine.optimizer_step()
    return engine


def test_the_planted_payload_is_live(tmp_path) -> None:
    # guard for every test here: an unrestricted load of the planted file does run the command
    marker = tmp_path / "ran"
    plant(tmp_path / "x.pt", marker)
    torch.load(tmp_path / "x.pt", weights_only=False)
    assert marker.exists()


@pytest.mark.parametrize("name", [OPTIMIZER_FILE, EXTRA_STATE_FILE])
def test_planted_engine_file_is_refused_and_nothing_runs(name, tmp_path) -> None:
    engine = _trained_engine()
    engine.save_checkpoint(tmp_path / "c")
    marker = tmp_path / "ran"
    plant(tmp_path / "c" / name, marker)
    fresh = TorchEngine(build_tiny_model(seed=1), lr=1e-2)
    before = {k: v.clone() for k, v in fresh.module.state_dict().items()}
    with pytest.raises(CheckpointFileError, match=f"c/{name}: refused: it holds Python objects"):
        fresh.load_checkpoint(tmp_path / "c")
    assert not marker.exists()
    # every file is read before anything is applied: the module is as it was
    assert all(torch.equal(v, fresh.module.state_dict()[k]) for k, v in before.items())


def test_truncated_optimizer_file_is_named(tmp_path) -> None:
    _trained_engine().save_checkpoint(tmp_path / "c")
    file = tmp_path / "c" / OPTIMIZER_FILE
    file.write_bytes(file.read_bytes()[:1000])
    with pytest.raises(CheckpointFileError, match=r"c/optimizer.pt: damaged or truncated \(RuntimeError"):
        TorchEngine(build_tiny_model(seed=0), lr=1e-2).load_checkpoint(tmp_path / "c")
    assert isinstance(CheckpointFileError(file, "x"), RuntimeError)


def test_planted_shuffle_state_is_refused(tmp_path) -> None:
    generator = torch.Generator().manual_seed(3)
    save_shuffle_state(str(tmp_path), 0, generator)
    load_shuffle_state(str(tmp_path), 0, torch.Generator())  # the real file loads
    marker = tmp_path / "ran"
    plant(Path(shuffle_state_file(str(tmp_path), 0)), marker)
    with pytest.raises(CheckpointFileError, match="shuffle_rng_rank_0.pt: refused"):
        load_shuffle_state(str(tmp_path), 0, torch.Generator())
    assert not marker.exists()
    torch.save(torch.zeros(3), shuffle_state_file(str(tmp_path), 0))
    with pytest.raises(CheckpointFileError, match="not a random generator state"):
        load_shuffle_state(str(tmp_path), 0, torch.Generator())


def test_load_torch_data_names_a_missing_file(tmp_path) -> None:
    with pytest.raises(CheckpointFileError, match="nothing.pt: missing"):
        load_torch_data(tmp_path / "nothing.pt")


# ------------------------------------------------------------------------------ FSDP (DCP)


def _fsdp_checkpoint(path: Path) -> FSDPEngine:
    engine = FSDPEngine(build_tiny_model(seed=0), lr=1e-3)
    for p in engine.module.parameters():
        p.grad = torch.ones_like(p)
    engine.optimizer_step()
    engine.save_checkpoint(path)
    return engine


def test_fsdp_round_trip_reads_optimizer_entries_as_data(one_rank_group, tmp_path) -> None:
    saved = _fsdp_checkpoint(tmp_path / "c")
    fresh = FSDPEngine(build_tiny_model(seed=1), lr=5e-2)
    fresh.load_checkpoint(tmp_path / "c")  # param_groups (lr, betas, ...) come through SafeLoadPlanner
    assert fresh.optimizer.param_groups[0]["lr"] == saved.optimizer.param_groups[0]["lr"] == 1e-3
    a, b = saved.optimizer.state_dict()["state"], fresh.optimizer.state_dict()["state"]
    assert a.keys() == b.keys()
    for key in a:
        for name, value in a[key].items():
            other = b[key][name]
            value, other = (getattr(t, "full_tensor", lambda t=t: t)() for t in (value, other))
            assert torch.equal(value, other), (key, name)


@pytest.mark.parametrize("planted", ["model/.metadata", "optim/.metadata", "extra"])
def test_fsdp_planted_files_are_refused_and_nothing_runs(planted, one_rank_group, tmp_path) -> None:
    _fsdp_checkpoint(tmp_path / "c")
    marker = tmp_path / "ran"
    file = tmp_path / "c" / (extra_state_file(0, 1) if planted == "extra" else planted)
    if planted == "extra":
        plant(file, marker)
    else:
        file.write_bytes(pickle.dumps(Payload(marker)))  # DCP writes .metadata as a plain pickle
    engine = FSDPEngine(build_tiny_model(seed=1), lr=1e-3)
    with pytest.raises(CheckpointFileError, match="refused") as info:
        engine.load_checkpoint(tmp_path / "c")
    assert str(file) in str(info.value)
    assert not marker.exists()


def test_fsdp_merger_read_refuses_a_planted_metadata(tmp_path, one_rank_group) -> None:
    _fsdp_checkpoint(tmp_path / "c")
    assert "model.embed_tokens.weight" in read_full_model_state(tmp_path / "c")
    marker = tmp_path / "ran"
    (tmp_path / "c" / "model" / ".metadata").write_bytes(pickle.dumps(Payload(marker)))
    with pytest.raises(CheckpointFileError, match=r"model/.metadata: refused: global posix.system|model/.metadata: refused"):
        read_full_model_state(tmp_path / "c")
    assert not marker.exists()


def test_safe_planner_refuses_a_planted_entry(tmp_path) -> None:
    marker = tmp_path / "ran"
    buffer = io.BytesIO()
    torch.save(Payload(marker), buffer)
    buffer.seek(0)

    class Item:  # the two fields load_bytes reads from a ReadItem
        class storage_index:
            fqn = "param_groups.0.lr"

        dest_index = storage_index

    with pytest.raises(CheckpointFileError, match="param_groups.0.lr .*refused"):
        SafeLoadPlanner().load_bytes(Item(), buffer)  # type: ignore[arg-type]
    assert not marker.exists()
