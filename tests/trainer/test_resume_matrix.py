"""Crash anywhere, resume exactly: a run stopped at a chosen point and resumed (resume_mode=auto)
ends with the same metrics rows (one per step) and bit-identical weights as a run that never
stopped. Crashes are raised in-process from a patched phase; the resumed run builds everything
anew (workers, loaders, trackers), as a restarted process would."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from hybridflow.config import load_config
from hybridflow.controller import WorkerError
from hybridflow.engine import TorchEngine
from hybridflow.entrypoints.train import build_trainer
from hybridflow.inference import generation
from hybridflow.trainer import checkpoint as ckpt
from hybridflow.trainer.core import PPOTrainer

from .conftest import tiny_overrides

pytestmark = pytest.mark.usefixtures("one_torch_thread")

# Two shuffled mini-batches per step (the shuffle RNG and the optimizer must resume too); steps
# 1–3, checkpoints after steps 2 and 3; the crashes hit step 3 unless said otherwise.
COMMON = (
    "trainer.total_training_steps=3", "trainer.save_freq=2", "actor_rollout_ref.actor.use_kl_loss=true",
    "actor_rollout_ref.actor.ppo_mini_batch_size=2", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
    "actor_rollout_ref.actor.shuffle=true",
)
VARIANTS: dict[str, tuple[str, ...]] = {
    "fp32": (),
    "bf16": ("actor_rollout_ref.model.dtype=bf16",),
    "lora": ("actor_rollout_ref.model.lora_rank=4", "actor_rollout_ref.model.lora_alpha=8",
             "actor_rollout_ref.actor.optim.lr=1e-2"),
    "critic": ("algorithm.adv_estimator=gae", "critic.ppo_micro_batch_size_per_gpu=2"),
}
# DAPO: prompts with an odd answer score alike and are dropped, so steps take further batches.
HALF_FLAT_SCORER = '''
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    if int(ground_truth) % 2:
        return 0.5
    return sum("a" <= ch <= "z" for ch in solution_str) / max(len(solution_str), 1)
'''


class Crash(Exception):
    """The simulated crash (a worker-side one reaches the controller as a WorkerError)."""

    def __init__(self, where: str) -> None:
        super().__init__(f"simulated crash in {where}")


class Phase:
    """The step the trainer is in (set when ``step`` starts; kept through its checkpoint)."""

    step = 0


def _track_step(monkeypatch: pytest.MonkeyPatch) -> None:
    original = PPOTrainer.step

    def step(self, prompts=None):
        Phase.step = self.global_steps
        return original(self, prompts)

    monkeypatch.setattr(PPOTrainer, "step", step)


def _calls_until(count: int, at_step: int = 3) -> Callable[[], bool]:
    """True on the ``count``-th call made during step ``at_step``."""
    seen = {"n": 0}

    def due() -> bool:
        if Phase.step != at_step:
            return False
        seen["n"] += 1
        return seen["n"] == count

    return due


def _raise_in(monkeypatch, owner, name: str, due: Callable[..., bool], after: bool = False) -> None:
    """Patch ``owner.name`` to raise :class:`Crash` when ``due(*args)`` (after the real call if ``after``)."""
    original = getattr(owner, name)

    def patched(*args, **kwargs):
        if not after and due(*args):
            raise Crash(name)
        out = original(*args, **kwargs)
        if after and due(*args):
            raise Crash(name)
        return out

    monkeypatch.setattr(owner, name, patched)


def crash_mid_generation(monkeypatch) -> None:
    due = _calls_until(3)  # the 3rd token of step 3
    _raise_in(monkeypatch, generation, "sample_next", lambda *a: due())


def crash_mid_update(monkeypatch) -> None:
    due = _calls_until(2)  # the first of step 3's optimizer steps has been applied, the next never runs
    _raise_in(monkeypatch, TorchEngine, "optimizer_step", lambda *a: due())


def crash_mid_checkpoint_write(monkeypatch) -> None:
    def cut_short(path, state):  # the controller state is half written when the process dies
        original_save(path, state)
        if Phase.step == 3:
            path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
            raise Crash("save_controller_state")

    original_save = ckpt.save_controller_state
    monkeypatch.setattr(ckpt, "save_controller_state", cut_short)


def crash_between_log_and_commit(monkeypatch) -> None:
    _raise_in(monkeypatch, ckpt, "commit_checkpoint", lambda *a: Phase.step == 3)


def crash_right_after_commit(monkeypatch) -> None:
    # global_step_2 is complete: its metrics row must already be in metrics.jsonl
    _raise_in(monkeypatch, ckpt, "commit_checkpoint", lambda *a: Phase.step == 2, after=True)


def crash_between_commit_and_pointer(monkeypatch) -> None:
    # global_step_2 is renamed into place; latest_checkpointed_iteration.txt is never written
    _raise_in(monkeypatch, ckpt, "atomic_write_text", lambda path, text: path.name == ckpt.LATEST_FILE and Phase.step == 2)


# ------------------------------------------------------------------------------ runs
def _config(task_dir: Path, run_dir: Path, model_dir: Path, *extra: str):
    return load_config(None, tiny_overrides(task_dir, run_dir, model_dir, *COMMON, *extra))


def run(config) -> None:
    """``hybridflow.entrypoints.train.run`` without drawing the curves (a third of a tiny run's time)."""
    trainer = build_trainer(config)
    try:
        trainer.fit()
    finally:
        trainer.close()


def _rows(run_dir: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return [{k: v for k, v in r.items() if not k.startswith(("timing_s/", "perf/"))} for r in rows]


def _weights(run_dir: Path) -> dict[str, torch.Tensor]:
    step = run_dir / "global_step_3"
    out = {}
    for role in ("actor", "critic"):
        if (step / role).is_dir():
            out |= {f"{role}/{k}": v for k, v in load_file(step / role / "model.safetensors").items()}
    return out


def _assert_same_run(resumed: Path, uninterrupted: tuple[list[dict], dict[str, torch.Tensor]]) -> None:
    rows, weights = uninterrupted
    # bitwise by construction: both runs in this process, same kernels and thread count, and an
    # exact resume restores every weight, optimizer moment and RNG state the next step reads
    assert [r["step"] for r in _rows(resumed)] == [1, 2, 3]
    assert _rows(resumed) == rows
    got = _weights(resumed)
    assert got.keys() == weights.keys() and all(torch.equal(got[k], weights[k]) for k in weights)


@pytest.fixture(scope="module")
def uninterrupted(tiny_task_dir, tiny_model_dir, tmp_path_factory) -> Callable[..., tuple[list[dict], dict]]:
    """The uninterrupted run of a variant (each computed once per module)."""
    cache: dict[tuple[str, ...], tuple[list[dict], dict]] = {}

    def get(*extra: str) -> tuple[list[dict], dict]:
        if extra not in cache:
            run_dir = tmp_path_factory.mktemp("full") / "run"
            run(_config(tiny_task_dir, run_dir, tiny_model_dir, *extra))
            cache[extra] = (_rows(run_dir), _weights(run_dir))
        return cache[extra]

    return get


def _crash_and_resume(monkeypatch, arm, run_dir: Path, config) -> None:
    Phase.step = 0
    with monkeypatch.context() as patch:
        _track_step(patch)
        arm(patch)
        with pytest.raises((Crash, WorkerError), match="simulated crash"):
            run(config)
    Phase.step = 0
    run(config)


CRASHES = {
    "mid_generation": crash_mid_generation,
    "mid_update": crash_mid_update,
    "mid_checkpoint_write": crash_mid_checkpoint_write,
    "between_log_and_commit": crash_between_log_and_commit,
    "right_after_commit": crash_right_after_commit,
    "between_commit_and_pointer": crash_between_commit_and_pointer,
}


@pytest.mark.parametrize("crash", list(CRASHES))
def test_crash_points_resume_bit_for_bit(crash, monkeypatch, uninterrupted, tiny_task_dir, tiny_model_dir, tmp_path):
    run_dir = tmp_path / "run"
    config = _config(tiny_task_dir, run_dir, tiny_model_dir)
    _crash_and_resume(monkeypatch, CRASHES[crash], run_dir, config)
    _assert_same_run(run_dir, uninterrupted())
    dropped = run_dir / "metrics.dropped.jsonl"
    if crash == "between_log_and_commit":  # step 3's row was logged, its checkpoint never committed
        assert [json.loads(line)["step"] for line in dropped.read_text().splitlines()] == [3]
    elif crash == "mid_checkpoint_write":
        assert [json.loads(line)["step"] for line in dropped.read_text().splitlines()] == [3]
        assert not (run_dir / "global_step_3.partial").exists()  # replaced by the resumed run's save
    else:
        assert not dropped.exists()


@pytest.mark.parametrize("variant", ["bf16", "lora", "critic"])
def test_variants_resume_bit_for_bit_after_a_crash_mid_update(variant, monkeypatch, uninterrupted, tiny_task_dir,
                                                               tiny_model_dir, tmp_path):
    run_dir = tmp_path / "run"
    config = _config(tiny_task_dir, run_dir, tiny_model_dir, *VARIANTS[variant])
    _crash_and_resume(monkeypatch, crash_mid_update, run_dir, config)
    _assert_same_run(run_dir, uninterrupted(*VARIANTS[variant]))
    if variant == "critic":
        assert any(k.startswith("critic/") for k in _weights(run_dir))
        assert "critic/vf_loss" in _rows(run_dir)[-1]


def test_dapo_dynamic_sampling_resumes_bit_for_bit(monkeypatch, uninterrupted, tiny_task_dir, tiny_model_dir, tmp_path):
    scorer = tmp_path / "half_flat.py"
    scorer.write_text(HALF_FLAT_SCORER)
    extra = (f"custom_reward_function.path={scorer}", "algorithm.filter_groups.enable=true",
             "actor_rollout_ref.rollout.n=4", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8")
    full_rows, _ = uninterrupted(*extra)
    assert max(r["train/num_gen_batches"] for r in full_rows) > 1  # the loader moved past the step's first batch
    run_dir = tmp_path / "run"
    _crash_and_resume(monkeypatch, crash_mid_generation, run_dir, _config(tiny_task_dir, run_dir, tiny_model_dir, *extra))
    _assert_same_run(run_dir, uninterrupted(*extra))


def test_damaged_newest_checkpoint_falls_back(uninterrupted, tiny_task_dir, tiny_model_dir, tmp_path, capsys):
    run_dir = tmp_path / "run"
    config = _config(tiny_task_dir, run_dir, tiny_model_dir)
    run(config)
    optimizer = run_dir / "global_step_3" / "actor" / "optimizer.pt"
    optimizer.write_bytes(optimizer.read_bytes()[:1000])  # truncated, e.g. a full disk during a copy
    run(config)  # finished at step 3 — but step 3 is damaged: back to step 2, and step 3 again
    out = capsys.readouterr().out
    assert "global_step_3/actor/optimizer.pt is damaged" in out and "global_step_2, the newest complete one" in out
    _assert_same_run(run_dir, uninterrupted())


@pytest.mark.ray
def test_ray_two_ranks_resume_bit_for_bit(ray_session, monkeypatch, tiny_task_dir, tiny_model_dir, tmp_path):
    # Two Ray ranks (FSDP, gloo): the crash is on the controller, between step 3's row and its commit.
    from hybridflow.engine.fsdp_checkpoint import read_full_model_state

    extra = ("trainer.backend=ray", "trainer.n_gpus_per_node=2")
    full_dir, run_dir = tmp_path / "full", tmp_path / "run"
    run(_config(tiny_task_dir, full_dir, tiny_model_dir, *extra))
    _crash_and_resume(monkeypatch, crash_between_log_and_commit, run_dir, _config(tiny_task_dir, run_dir, tiny_model_dir, *extra))
    # bitwise by construction: both runs on the same layout (two Ray ranks with the same thread
    # counts, the same kernels and the same reduction order); an exact resume restores all state
    assert _rows(run_dir) == _rows(full_dir) and [r["step"] for r in _rows(run_dir)] == [1, 2, 3]
    a, b = (read_full_model_state(d / "global_step_3" / "actor") for d in (full_dir, run_dir))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
