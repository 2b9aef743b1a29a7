"""The hybrid-engine contract for rollout.name=vllm|sglang: settings in, sleep / wake order out.

A 3-step GRPO run on the tiny model (CPU, colocated actor + rollout, synchronous schedule) with
the rollout on a FAKE vLLM or SGLang engine (tests/rollout/fake_engines.py): vLLM and SGLang are
CUDA-only, so the fakes stand in for the packages, answer the adapters' calls and record each
one. The real adapters, rollout worker and trainer run unchanged. Checked:

* the engine constructor receives the rollout config's settings, spelled the engine's way
  (``gpu_memory_utilization=0.37`` → vLLM ``gpu_memory_utilization`` / SGLang
  ``mem_fraction_static`` …), plus ``engine_kwargs.<engine>``;
* per step, with ``free_cache_engine=true``: generate → sleep → (training phases) → wake the
  weights → push the new weights → wake the KV cache → next generate;
* with ``free_cache_engine=false``: no sleep and no wake-up at all.

The real engines run the same three steps in ``scripts/gpu_check.sh`` (check 6).
"""

from __future__ import annotations

from itertools import groupby
from pathlib import Path
from typing import Any

import pytest
import torch

from hybridflow.config import load_config
from hybridflow.config.actor_rollout_ref import EngineKwargsConfig, RolloutConfig
from hybridflow.entrypoints.train import run
from hybridflow.inference.adapters.common import served_tensor_shapes
from hybridflow.trainer.phases import PolicyUpdate
from hybridflow.utils.async_run import run_coroutine
from hybridflow.workers.rollout.engine_settings import engine_args, unread_settings
from hybridflow.workers.rollout.worker import RolloutWorker

from .fake_engines import EVENTS, install

DENSE_REWARD = Path(__file__).resolve().parents[1] / "trainer" / "dense_reward.py"
SETTINGS = (
    "actor_rollout_ref.rollout.gpu_memory_utilization=0.37",
    "actor_rollout_ref.rollout.max_model_len=160",
    "actor_rollout_ref.rollout.max_num_seqs=17",
    "actor_rollout_ref.rollout.enforce_eager=true",
    "actor_rollout_ref.rollout.enable_prefix_caching=false",
    "actor_rollout_ref.rollout.enable_chunked_prefill=false",
    "actor_rollout_ref.rollout.dtype=float32",
    "actor_rollout_ref.rollout.seed=5",
)
ENGINE_ARGS = {
    "vllm": {
        "model": None,  # the model folder: checked apart
        "enable_sleep_mode": True,
        "gpu_memory_utilization": 0.37,
        "max_model_len": 160,
        "max_num_seqs": 17,
        "enforce_eager": True,
        "enable_prefix_caching": False,
        "enable_chunked_prefill": False,
        "dtype": "float32",
        "seed": 5,
        "tensor_parallel_size": 1,
        "max_num_batched_tokens": 8192,
        "load_format": "dummy",
        "disable_log_stats": True,
        "logprobs_mode": "processed_logprobs",
        "swap_space": 2,  # from engine_kwargs.vllm
    },
    "sglang": {
        "model_path": None,
        "enable_memory_saver": True,
        "mem_fraction_static": 0.37,
        "context_length": 160,
        "max_running_requests": 17,
        "disable_cuda_graph": True,
        "disable_radix_cache": True,
        "chunked_prefill_size": -1,
        "dtype": "float32",
        "random_seed": 5,
        "tp_size": 1,
        "load_format": "dummy",
        "log_level": "error",  # from engine_kwargs.sglang
    },
}
EXTRA = {"vllm": "{swap_space: 2}", "sglang": "{log_level: error}"}
SLEEP = {"vllm": ("sleep", 2), "sglang": ("sleep", ("kv_cache", "weights"))}


def _train(task_dir: Path, run_dir: Path, model_dir: Path, name: str, *extra: str) -> None:
    run(
        load_config(
            None,
            [
                f"data.train_files=[{task_dir / 'train.parquet'}]",
                f"data.val_files=[{task_dir / 'test.parquet'}]",
                "data.train_batch_size=4",
                "data.max_prompt_length=96",
                "data.max_response_length=8",
                f"actor_rollout_ref.model.path={model_dir}",
                "actor_rollout_ref.model.dtype=fp32",
                "actor_rollout_ref.actor.ppo_mini_batch_size=4",
                "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
                "actor_rollout_ref.rollout.n=2",
                f"actor_rollout_ref.rollout.name={name}",
                f"actor_rollout_ref.rollout.engine_kwargs.{name}={EXTRA[name]}",
                "trainer.total_training_steps=3",
                "trainer.val_before_train=false",
                "trainer.test_freq=0",
                "trainer.logger=[jsonl]",
                f"trainer.default_local_dir={run_dir}",
                f"custom_reward_function.path={DENSE_REWARD}",
                *SETTINGS,
                *extra,
            ],
        )
    )


def _order(events: list[tuple[Any, ...]]) -> list[Any]:
    """The calls in order, a run of generations (or of weight buckets) as one entry; the cache
    resets the adapters add after a push or a wake-up are left out."""
    calls = [e[:1] if e[0] in ("generate", "push") else e for e in events if e[0] != "reset_cache"]
    return [key for key, _ in groupby(calls)]


@pytest.fixture
def train_marks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Record where the training phases (3–7) run, among the engine calls."""
    original = PolicyUpdate.run

    def marked(self: PolicyUpdate, *args: Any, **kwargs: Any) -> Any:
        EVENTS.append(("train",))
        return original(self, *args, **kwargs)

    monkeypatch.setattr(PolicyUpdate, "run", marked)


@pytest.mark.parametrize("name", ["vllm", "sglang"])
def test_colocated_engine_sleeps_for_training_and_wakes_for_the_push(
    name: str,
    tiny_task_dir: Path,
    tiny_model_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    train_marks: None,
) -> None:
    events = install(monkeypatch, name)
    _train(tiny_task_dir, tmp_path, tiny_model_dir, name)
    (init,) = [e for e in events if e[0].endswith(".init")]
    args = init[1]
    model_key = "model" if name == "vllm" else "model_path"
    assert Path(args[model_key]) == tiny_model_dir
    got = {key: args[key] for key in ENGINE_ARGS[name] if key != model_key}
    assert got == {key: value for key, value in ENGINE_ARGS[name].items() if key != model_key}
    step = [SLEEP[name], ("train",), ("wake_up", ("weights",)), ("push",), ("wake_up", ("kv_cache",)), ("generate",)]
    # step 1 pushes the actor's weights over the dummy ones first; the last step's validation generates at the end
    assert _order(events[1:]) == [("push",), ("generate",), *step * 3]


@pytest.mark.parametrize("name", ["vllm", "sglang"])
def test_free_cache_engine_false_never_sleeps(
    name: str,
    tiny_task_dir: Path,
    tiny_model_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    train_marks: None,
) -> None:
    events = install(monkeypatch, name)
    _train(tiny_task_dir, tmp_path, tiny_model_dir, name, "actor_rollout_ref.rollout.free_cache_engine=false")
    assert _order(events[1:]) == [("push",), ("generate",), *[("train",), ("push",), ("generate",)] * 3]


def test_engine_kwargs_that_clash_with_a_setting_are_refused() -> None:
    cfg = RolloutConfig(name="vllm", engine_kwargs=EngineKwargsConfig(vllm={"gpu_memory_utilization": 0.9}))
    with pytest.raises(ValueError, match=r"engine_kwargs.vllm sets \['gpu_memory_utilization'\].*rollout settings"):
        engine_args(cfg)
    cfg = RolloutConfig(name="sglang", engine_kwargs=EngineKwargsConfig(sglang={"enable_memory_saver": False}))
    with pytest.raises(ValueError, match=r"engine_kwargs.sglang sets \['enable_memory_saver'\].*the adapter sets"):
        engine_args(cfg)
    cfg = RolloutConfig(
        name="sglang", max_model_len=None, engine_kwargs=EngineKwargsConfig(sglang={"context_length": 64})
    )
    assert engine_args(cfg)["context_length"] == 64  # a null setting leaves the key to engine_kwargs


def test_the_built_in_engine_names_each_changed_gpu_setting_it_ignores() -> None:
    cfg = RolloutConfig(
        name="torch",
        gpu_memory_utilization=0.37,
        enforce_eager=True,
        engine_kwargs=EngineKwargsConfig(vllm={"swap_space": 2}),
    )
    assert unread_settings(cfg) == [
        "ignored by rollout.name=torch: actor_rollout_ref.rollout.gpu_memory_utilization=0.37",
        "ignored by rollout.name=torch: actor_rollout_ref.rollout.enforce_eager=True",
        "ignored by rollout.name=torch: actor_rollout_ref.rollout.engine_kwargs.vllm",
    ]
    assert unread_settings(RolloutConfig(name="torch")) == []  # verl's defaults: nothing to say
    sglang = RolloutConfig(name="sglang", max_num_batched_tokens=4096, gpu_memory_utilization=0.37)
    assert unread_settings(sglang) == [
        "ignored by rollout.name=sglang: actor_rollout_ref.rollout.max_num_batched_tokens=4096"
    ]


def test_a_rollout_without_a_colocated_actor_loads_real_weights_and_keeps_them_asleep(
    tiny_model_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """No actor to push weights after a level-2 sleep (or over dummy ones): verl's rule loads the
    model's files (load_format auto) and sleeps at level 1 (weights kept in host memory)."""
    events = install(monkeypatch, "vllm")
    cfg = load_config(
        None,
        [
            f"actor_rollout_ref.model.path={tiny_model_dir}",
            "actor_rollout_ref.rollout.name=vllm",
            "actor_rollout_ref.rollout.response_length=4",
        ],
    )
    worker = RolloutWorker(cfg.actor_rollout_ref, share_name=None)
    worker.init_model()
    assert events[0][1]["load_format"] == "auto" and "load_format=dummy needs a colocated actor" in caplog.text
    worker.sleep()
    worker.wake_up()
    assert events[1:] == [("sleep", 1), ("wake_up", ("weights",)), ("wake_up", ("kv_cache",)), ("reset_cache",)]
    shapes = served_tensor_shapes(tiny_model_dir)
    assert shapes is not None
    worker.update_weights({name: torch.zeros(shape) for name, shape in shapes.items()}, version=7)
    assert run_coroutine(worker._engine.get_weight_version()) == 7  # its tokens carry the version it loaded
    assert sum(e[1] for e in events if e[0] == "push") == len(shapes)  # every tensor, in buckets


def test_the_built_in_rollout_warns_once_per_ignored_gpu_setting(
    tiny_model_dir: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    cfg = load_config(
        None,
        [
            f"actor_rollout_ref.model.path={tiny_model_dir}",
            "actor_rollout_ref.rollout.response_length=4",
            "actor_rollout_ref.rollout.gpu_memory_utilization=0.37",
        ],
    )
    RolloutWorker(cfg.actor_rollout_ref, share_name=None).init_model()
    lines = [r.getMessage() for r in caplog.records if "ignored by rollout.name" in r.getMessage()]
    assert lines == ["ignored by rollout.name=torch: actor_rollout_ref.rollout.gpu_memory_utilization=0.37"]
