"""`hybridflow sft` and `hybridflow rm` over data-parallel ranks started by torchrun (gloo, CPU).

Each multi-rank run is a real ``python -m torch.distributed.run --standalone --nproc_per_node=N``
subprocess, one thread per rank. The reference is the same config trained in one process (the
torch engine) in this test's process: with the loss normalised by the global token (or pair)
count, DP=2 must give the same per-step metrics and the same final weights, up to the order of
float sums (tolerance of tests/numerics.py, fp32). Also: packed rows (``model.use_remove_padding``)
train like padded ones; a rank that fails stops the whole job with a message naming it; sharded
checkpoints resume into another number of ranks and export to a Hugging Face folder.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from hybridflow.config import load_sft_config
from hybridflow.config.rm_rules import load_rm_config
from hybridflow.data import write_rows
from hybridflow.data.tasks import TASKS, ArithmeticSettings, generate_arithmetic
from hybridflow.data.tasks.arithmetic_sft import add_responses
from hybridflow.entrypoints.data import build_parser
from hybridflow.entrypoints.rm import build_rm_trainer
from hybridflow.entrypoints.sft import build_sft_trainer
from hybridflow.trainer.supervised.base import fit_and_report
from hybridflow.trainer.supervised.sft_trainer import SFTTrainer
from tests.numerics import TINY_WIDTH, assert_close_across

pytestmark = pytest.mark.usefixtures("one_torch_thread")
ROOT = Path(__file__).resolve().parents[2]
STEPS = 5
# 5 optimizer steps of forward + backward through the tiny model's 2 layers: the chain of sums
# whose order DP=2 changes (each rank's partial sums, then the all-reduce)
DEPTH = 2 * STEPS
COMPARED = (
    "train/loss",
    "train/grad_norm",
    "train/num_loss_tokens",
    "train/accuracy",
    "train/margin",
    "val/loss",
    "val/accuracy",
    "val/margin",
    "train/lr",
    "perf/total_num_tokens",
)


@pytest.fixture(scope="module")
def sft_files(tmp_path_factory) -> tuple[Path, Path]:
    """16 training and 5 validation one-digit additions with worked answers (the last validation
    batch, of 2 rows each, holds 1: rank 1's slice is padded and left out of the sums)."""
    train, test = generate_arithmetic(16, 5, seed=0, settings=ArithmeticSettings(min_value=0, max_value=9))
    root = tmp_path_factory.mktemp("sft_mp_data")
    return write_rows(add_responses(train), root / "train.parquet"), write_rows(
        add_responses(test), root / "test.parquet"
    )


@pytest.fixture(scope="module")
def pair_file(tmp_path_factory) -> Path:
    args = build_parser().parse_args(
        [
            "arithmetic-pairs",
            "--out",
            "x",
            "--digits",
            "1",
            "--train-size",
            "24",
            "--test-size",
            "4",
            "--exclude-test-size",
            "0",
        ]
    )
    train, _ = TASKS.get("arithmetic-pairs").build(args)
    return write_rows(train, tmp_path_factory.mktemp("rm_mp_data") / "pairs.parquet")


def _overrides(model_dir: Path, train: Path, val: Path, out: Path, max_length: int, lr: str) -> list[str]:
    """The job both trainers run here: batches of 4 rows in micro-batches of 2, constant lr,
    STEPS steps, validation every 2 steps, fp32 on the CPU, metrics to jsonl."""
    return [
        f"model.path={model_dir}",
        "model.dtype=fp32",
        f"data.train_files=[{train}]",
        f"data.val_files=[{val}]",
        f"data.max_length={max_length}",
        "data.train_batch_size=4",
        "data.micro_batch_size_per_gpu=2",
        f"optim.lr={lr}",
        "optim.lr_scheduler_type=constant",
        "optim.lr_warmup_steps_ratio=0",
        f"trainer.total_training_steps={STEPS}",
        "trainer.test_freq=2",
        "trainer.device=cpu",
        f"trainer.default_local_dir={out}",
        "trainer.logger=[jsonl]",
    ]


def _sft_overrides(tiny_model_dir: Path, files: tuple[Path, Path], out: Path, *extra: str) -> list[str]:
    return [*_overrides(tiny_model_dir, *files, out, max_length=96, lr="1e-3"), *extra]


def _rm_overrides(model_dir: Path, pair_file: Path, out: Path, *extra: str) -> list[str]:
    return [*_overrides(model_dir, pair_file, pair_file, out, max_length=128, lr="2e-3"), *extra]


TORCHRUN_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


def _torchrun(nproc: int, target: list[str], overrides: list[str], timeout: float = 120) -> subprocess.CompletedProcess:
    """``target`` (``["-m", module]`` or ``[script]``) under torchrun with ``nproc`` gloo ranks."""
    env = {k: v for k, v in os.environ.items() if k not in TORCHRUN_VARS}
    env |= {"OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={nproc}",
        *target,
        *overrides,
    ]
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


def _ok(proc: subprocess.CompletedProcess) -> None:
    assert proc.returncode == 0, (
        f"exit {proc.returncode}\nstdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-6000:]}"
    )


def _metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _compared(rows: list[dict], keys: tuple[str, ...] = COMPARED) -> list[dict]:
    return [{k: row[k] for k in keys if k in row} | {"step": row["step"]} for row in rows]


def _weights(run_dir: Path, step: int = STEPS) -> dict[str, torch.Tensor]:
    return load_file(run_dir / f"global_step_{step}" / "hf" / "model.safetensors")


def _max_relative(actual: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> float:
    """‖a − b‖ / ‖b‖ over all the weights together: the relative difference of the final model
    (asserted ≤ 1e-5). Not per element, nor per small tensor: AdamW's normalised step m/√v turns
    a last-bit difference of a gradient element that is small against its history into a step
    difference of up to ~lr for that one element (seen: 1 element of 16384 off by 9e-5 after 5
    reward-model steps at lr 2e-3, while every per-step loss agreed within 1.1e-6)."""
    assert actual.keys() == expected.keys()
    diff = sum(float((actual[k] - expected[k]).double().square().sum()) for k in expected)
    norm = sum(float(expected[k].double().square().sum()) for k in expected)
    return (diff / norm) ** 0.5


def _assert_same_run(dp2_dir: Path, dp1_dir: Path, what: str, keys: tuple[str, ...] = COMPARED) -> None:
    dp2, dp1 = _compared(_metrics(dp2_dir), keys), _compared(_metrics(dp1_dir), keys)
    assert [r["step"] for r in dp2] == [r["step"] for r in dp1]  # one row per step: only rank 0 logged
    assert_close_across(dp2, dp1, dtype=torch.float32, reduction_size=TINY_WIDTH, depth=DEPTH, what=what)
    losses = [(a["train/loss"], b["train/loss"]) for a, b in zip(dp2, dp1, strict=True) if "train/loss" in b]
    loss_rel = max(abs(a - b) / abs(b) for a, b in losses)
    dp2_weights, dp1_weights = _weights(dp2_dir), _weights(dp1_dir)
    weight_rel = _max_relative(dp2_weights, dp1_weights)
    largest = max(float((dp2_weights[k] - dp1_weights[k]).abs().max()) for k in dp1_weights)
    per_tensor = max(float((dp2_weights[k] - dp1_weights[k]).norm() / dp1_weights[k].norm()) for k in dp1_weights)
    print(
        f"{what}: max relative difference: per-step loss {loss_rel:.2e}, final weights {weight_rel:.2e} "
        f"(largest per tensor {per_tensor:.2e}, largest elementwise difference {largest:.2e})"
    )
    assert loss_rel <= 1e-5 and weight_rel <= 1e-5, (loss_rel, weight_rel)


def _sft_one_process(tiny_model_dir, sft_files, out: Path, *extra: str) -> SFTTrainer:
    trainer = build_sft_trainer(load_sft_config(None, _sft_overrides(tiny_model_dir, sft_files, out, *extra)))
    fit_and_report(trainer, str)
    return trainer


BY_TOKEN_BUDGET = ("data.use_dynamic_bsz=true", "data.max_token_len_per_gpu=100")
PACKED = ("model.use_remove_padding=true",)


@pytest.mark.parametrize(
    ("dp2_extra", "dp1_extra"),
    [((), ()), (BY_TOKEN_BUDGET, BY_TOKEN_BUDGET), ((*PACKED, *BY_TOKEN_BUDGET), ())],
    ids=["by_count", "by_token_budget", "packed_by_real_token_budget_vs_padded"],
)
def test_sft_two_ranks_train_like_one_process(tiny_model_dir, sft_files, tmp_path, dp2_extra, dp1_extra):
    """DP=2 = one process. The packed case: 2 ranks packing each micro-batch into one row, with
    micro-batches of ≤ 100 real tokens per rank, against one padded process with micro-batches
    of 2 rows: the same losses and weights, whatever the rows' grouping and layout."""
    start = time.perf_counter()
    dp2 = _sft_overrides(tiny_model_dir, sft_files, tmp_path / "dp2", *dp2_extra)
    _ok(_torchrun(2, ["-m", "hybridflow.entrypoints.sft"], dp2))
    elapsed = time.perf_counter() - start
    _sft_one_process(tiny_model_dir, sft_files, tmp_path / "dp1", *dp1_extra)
    _assert_same_run(tmp_path / "dp2", tmp_path / "dp1", f"sft DP=2 {dp2_extra} vs one process {dp1_extra}")
    actor = tmp_path / "dp2" / f"global_step_{STEPS}" / "actor"
    assert json.loads((actor / "fsdp_meta.json").read_text())["world_size"] == 2
    assert {p.name for p in (actor / "model").iterdir()} >= {"__0_0.distcp", "__1_0.distcp", ".metadata"}
    print(f"sft DP=2 torchrun wall time: {elapsed:.1f} s")
    assert elapsed < 60


def test_sft_packed_in_one_process_trains_like_padded(tiny_model_dir, sft_files, tmp_path):
    """`hybridflow sft model.use_remove_padding=true` in one plain process (the torch engine) =
    the padded run: per-step losses, gradient norms, validation losses and final weights."""
    from hybridflow.engine.forward import packs_rows

    assert packs_rows(_sft_one_process(tiny_model_dir, sft_files, tmp_path / "packed", *PACKED).engine.module)
    assert not packs_rows(_sft_one_process(tiny_model_dir, sft_files, tmp_path / "padded").engine.module)
    _assert_same_run(tmp_path / "packed", tmp_path / "padded", "sft packed vs padded, one process")


def test_export_merge_of_a_two_rank_checkpoint_reloads_the_trained_weights(tiny_model_dir, sft_files, tmp_path):
    """`hybridflow export merge` of the sharded (DCP) checkpoint 2 ranks wrote → a Hugging Face
    folder that ``AutoModelForCausalLM.from_pretrained`` loads with: exactly rank 0's ``hf/``
    weights, the one-process run's trained weights (within 1e-5), not the initial ones."""
    from transformers import AutoModelForCausalLM

    from hybridflow.entrypoints.export import main as export_main

    _ok(_torchrun(2, ["-m", "hybridflow.entrypoints.sft"], _sft_overrides(tiny_model_dir, sft_files, tmp_path / "dp2")))
    assert (
        json.loads((tmp_path / "dp2" / f"global_step_{STEPS}" / "actor" / "fsdp_meta.json").read_text())["world_size"]
        == 2
    )
    target = tmp_path / "exported"
    assert export_main(["merge", "--local_dir", str(tmp_path / "dp2"), "--target_dir", str(target)]) == 0
    reloaded = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32).state_dict()
    rank0_hf = _weights(tmp_path / "dp2")
    assert all(torch.equal(reloaded[k], rank0_hf[k]) for k in rank0_hf)
    _sft_one_process(tiny_model_dir, sft_files, tmp_path / "dp1")
    trained = _weights(tmp_path / "dp1")
    assert _max_relative({k: reloaded[k] for k in trained}, trained) <= 1e-5
    initial = load_file(tiny_model_dir / "model.safetensors")
    assert _max_relative({k: reloaded[k] for k in initial}, initial) > 1e-4  # 5 steps at lr 1e-3 moved them


def test_rm_two_ranks_train_like_one_process(tiny_model_dir, pair_file, tmp_path):
    start = time.perf_counter()
    _ok(_torchrun(2, ["-m", "hybridflow.entrypoints.rm"], _rm_overrides(tiny_model_dir, pair_file, tmp_path / "dp2")))
    elapsed = time.perf_counter() - start
    one = load_rm_config(None, _rm_overrides(tiny_model_dir, pair_file, tmp_path / "dp1"))
    fit_and_report(build_rm_trainer(one), str)
    _assert_same_run(tmp_path / "dp2", tmp_path / "dp1", "rm DP=2 vs one process")
    rows = _metrics(tmp_path / "dp2")
    assert rows[0]["step"] == 0 and "val/accuracy" in rows[0]  # val_before_train, split over the ranks too
    print(f"rm DP=2 torchrun wall time: {elapsed:.1f} s")
    assert elapsed < 60


CRASHING_RANK_1 = """
import sys
from hybridflow.entrypoints.sft import main
from hybridflow.trainer.supervised.sft_trainer import SFTTrainer

train_step = SFTTrainer.train_step


def failing_step(self, batch):
    if self.ranks.rank == 1 and self.global_step == 3:
        raise RuntimeError("injected failure on rank 1")
    return train_step(self, batch)


SFTTrainer.train_step = failing_step
sys.exit(main())
"""


def test_a_failing_rank_stops_the_job_with_its_rank_named(tiny_model_dir, sft_files, tmp_path):
    script = tmp_path / "crash_rank_1.py"
    script.write_text(CRASHING_RANK_1)
    start = time.perf_counter()
    proc = _torchrun(
        2, [str(script)], _sft_overrides(tiny_model_dir, sft_files, tmp_path / "run", "trainer.save_freq=2"), timeout=90
    )
    elapsed = time.perf_counter() - start
    assert proc.returncode != 0
    assert "hybridflow sft (rank 1 of 2): failed: RuntimeError: injected failure on rank 1" in proc.stderr
    assert "rank      : 1" in proc.stderr  # torchrun's failure summary names it too
    # rank 0 was blocked in a collective with rank 1: torchrun ended it, nothing hung
    print(f"failing rank 1: the job stopped after {elapsed:.1f} s")
    assert elapsed < 60, elapsed
    run = tmp_path / "run"
    assert (run / "latest_checkpointed_iteration.txt").read_text().strip() == "2"
    assert [r["step"] for r in _metrics(run)] == [1, 2]


@pytest.mark.parametrize(("first", "second"), [(2, 1), (1, 2)])
def test_sharded_checkpoints_resume_into_another_number_of_ranks(tiny_model_dir, sft_files, tmp_path, first, second):
    """3 steps on ``first`` ranks, then steps 4-5 on ``second`` ranks = 5 steps in one process."""
    run = tmp_path / "run"
    _ok(
        _torchrun(
            first,
            ["-m", "hybridflow.entrypoints.sft"],
            _sft_overrides(tiny_model_dir, sft_files, run, "trainer.total_training_steps=3"),
        )
    )
    proc = _torchrun(second, ["-m", "hybridflow.entrypoints.sft"], _sft_overrides(tiny_model_dir, sft_files, run))
    _ok(proc)
    assert f"resumed from {run / 'global_step_3'} at step 3" in proc.stdout
    _sft_one_process(tiny_model_dir, sft_files, tmp_path / "dp1")
    # the first run validated after its last step (3) too: compare the training metrics
    train_keys = tuple(k for k in COMPARED if k.startswith("train/"))
    _assert_same_run(run, tmp_path / "dp1", f"sft {first} ranks → {second} ranks vs one process", train_keys)


def test_process_counts_are_checked_against_torchrun(monkeypatch, tiny_model_dir, sft_files, tmp_path):
    from hybridflow.config import ConfigError

    overrides = _sft_overrides(tiny_model_dir, sft_files, tmp_path)
    # without torchrun: one machine (the Ray launcher), strategy fsdp for several ranks
    assert load_sft_config(None, [*overrides, "trainer.n_gpus_per_node=2"]).model.strategy == "fsdp"
    assert load_sft_config(None, overrides).model.strategy == "torch"
    with pytest.raises(
        ConfigError,
        match=r"the SFT trainer runs in one process, or in n_gpus_per_node Ray processes "
        r"on this machine; for several machines start it with torchrun on each: "
        r"`torchrun --nnodes=2 --nproc_per_node=1",
    ):
        load_sft_config(None, [*overrides, "trainer.nnodes=2"])
    with pytest.raises(ConfigError, match=r"model.strategy=fsdp needs a torch.distributed group"):
        load_sft_config(None, [*overrides, "model.strategy=fsdp"])
    with pytest.raises(ConfigError, match=r"model.strategy=torch trains in one process, but 2 were asked for"):
        load_sft_config(None, [*overrides, "model.strategy=torch", "trainer.n_gpus_per_node=2"])
    with pytest.raises(ConfigError, match=r"data.train_batch_size=4 does not split evenly over 3 processes"):
        load_sft_config(None, [*overrides, "trainer.n_gpus_per_node=3"])
    # under torchrun: its WORLD_SIZE rules
    for name, value in {
        "RANK": "0",
        "WORLD_SIZE": "2",
        "LOCAL_RANK": "0",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "1",
    }.items():
        monkeypatch.setenv(name, value)
    assert load_sft_config(None, overrides).model.strategy == "fsdp"
    assert load_sft_config(None, [*overrides, "trainer.n_gpus_per_node=2"]).trainer.n_gpus_per_node == 2
    with pytest.raises(ConfigError, match=r"1 × 4 = 4, but torchrun started 2 processes \(WORLD_SIZE=2\)"):
        load_sft_config(None, [*overrides, "trainer.n_gpus_per_node=4"])
    with pytest.raises(ConfigError, match=r"data.train_batch_size=3 does not split evenly over 2 processes"):
        load_sft_config(None, [*overrides, "data.train_batch_size=3"])
    with pytest.raises(ConfigError, match=r"model.strategy=torch trains in one process, but 2 were asked for"):
        load_sft_config(None, [*overrides, "model.strategy=torch"])
    rm = _rm_overrides(tiny_model_dir, tmp_path / "pairs.parquet", tmp_path)
    with pytest.raises(ConfigError, match=r"1 × 4 = 4, but torchrun started 2 processes"):
        load_rm_config(None, [*rm, "trainer.n_gpus_per_node=4"])


def test_sft_two_ray_ranks_without_torchrun_train_like_one_process(tiny_model_dir, sft_files, tmp_path):
    """`hybridflow sft trainer.n_gpus_per_node=2`: the PPO trainer's Ray worker group starts the ranks."""
    env = {k: v for k, v in os.environ.items() if k not in TORCHRUN_VARS}
    env |= {"OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    overrides = _sft_overrides(tiny_model_dir, sft_files, tmp_path / "ray", "trainer.n_gpus_per_node=2")
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "hybridflow.entrypoints.sft", *overrides],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    elapsed = time.perf_counter() - start
    _ok(proc)
    _sft_one_process(tiny_model_dir, sft_files, tmp_path / "dp1")
    _assert_same_run(tmp_path / "ray", tmp_path / "dp1", "sft 2 Ray ranks vs one process")
    print(f"sft 2 Ray ranks wall time: {elapsed:.1f} s")
    assert elapsed < 90  # starting a private Ray instance costs ~25 s more than torchrun on 2 busy cores


def test_a_one_process_checkpoint_resumes_on_two_ranks_and_not_the_other_way(
    tiny_model_dir, sft_files, tmp_path, capsys
):
    """Steps 1-3 in one plain process (torch engine files), 4-5 on 2 torchrun ranks = 5 steps in
    one process; the sharded step-5 checkpoint is then refused by a plain process, with how to resume it."""
    from hybridflow.entrypoints.sft import main

    run = tmp_path / "run"
    _sft_one_process(tiny_model_dir, sft_files, run, "trainer.total_training_steps=3")
    proc = _torchrun(2, ["-m", "hybridflow.entrypoints.sft"], _sft_overrides(tiny_model_dir, sft_files, run))
    _ok(proc)
    assert f"resumed from {run / 'global_step_3'} at step 3" in proc.stdout
    _sft_one_process(tiny_model_dir, sft_files, tmp_path / "dp1")
    train_keys = tuple(k for k in COMPARED if k.startswith("train/"))
    _assert_same_run(run, tmp_path / "dp1", "sft one process → 2 ranks vs one process", train_keys)
    capsys.readouterr()
    assert main(_sft_overrides(tiny_model_dir, sft_files, run, "trainer.total_training_steps=6")) == 2
    assert "is a sharded checkpoint written by several ranks; resume it under torchrun" in capsys.readouterr().err
