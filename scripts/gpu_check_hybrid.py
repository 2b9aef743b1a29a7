"""gpu_check.sh check 6: 3 colocated GRPO steps with a real vLLM or SGLang rollout engine.

    python scripts/gpu_check_hybrid.py ENGINE DATA_DIR MODEL RUN_DIR

Runs ``hybridflow.entrypoints.train`` in this process (one GPU, trainer.backend=local, the
rollout colocated with the actor, ``free_cache_engine=true``) and records, in order, the rollout
worker calls the trainer makes — generate, sleep, the training phases, wake_up, the weight push —
with the GPU memory in use (the whole device, so the engine's own processes count) around each
sleep and wake-up. Prints the order, the memory lines and one ``RESULT hybrid-ENGINE`` line: OK
when every step ran generate → sleep → train → wake(weights) → push → wake(kv_cache) and the
sleep freed memory.
"""

from __future__ import annotations

import functools
import sys
from typing import Any

import torch

from hybridflow.config import load_config
from hybridflow.entrypoints.train import run
from hybridflow.trainer.phases import PolicyUpdate
from hybridflow.workers.rollout.worker import RolloutWorker

CALLS: list[str] = []
MEMORY: list[tuple[str, float, float]] = []  # (call, GiB in use before, after)
STEPS = 3


def used_gib() -> float:
    free, total = torch.cuda.mem_get_info()
    return (total - free) / 2**30


def record(cls: Any, method: str, label: Any, measure: bool = False) -> None:
    """Wrap ``cls.method`` to log ``label(args)`` (and the memory around it) on every call."""
    original = getattr(cls, method)

    @functools.wraps(original)  # keeps the @register marking the worker group dispatches by
    def wrapped(self: Any, *args: Any, **kwargs: Any) -> Any:
        name = label(*args, **kwargs)
        before = used_gib()
        out = original(self, *args, **kwargs)
        CALLS.append(name)
        if measure:
            MEMORY.append((name, before, used_gib()))
        return out

    setattr(cls, method, wrapped)


def main(engine: str, data: str, model: str, run_dir: str) -> int:
    record(RolloutWorker, "generate_sequences", lambda *a, **k: "generate")
    record(RolloutWorker, "sleep", lambda *a, **k: "sleep", measure=True)
    record(RolloutWorker, "wake_up", lambda tags=None: f"wake_up({','.join(tags or ['all'])})", measure=True)
    record(RolloutWorker, "update_weights", lambda *a, **k: "push")
    record(PolicyUpdate, "run", lambda *a, **k: "train")
    run(
        load_config(
            None,
            [
                f"data.train_files=[{data}/train.parquet]",
                f"data.val_files=[{data}/test.parquet]",
                "data.train_batch_size=16",
                "data.max_prompt_length=128",
                "data.max_response_length=32",
                f"actor_rollout_ref.model.path={model}",
                "actor_rollout_ref.model.dtype=bf16",
                "actor_rollout_ref.actor.ppo_mini_batch_size=16",
                "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
                "actor_rollout_ref.rollout.n=4",
                f"actor_rollout_ref.rollout.name={engine}",
                "actor_rollout_ref.rollout.free_cache_engine=true",
                "actor_rollout_ref.rollout.gpu_memory_utilization=0.4",
                "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
                "trainer.device=cuda",
                "trainer.backend=local",
                "trainer.n_gpus_per_node=1",
                f"trainer.total_training_steps={STEPS}",
                "trainer.val_before_train=false",
                "trainer.test_freq=-1",
                "trainer.save_freq=-1",
                "trainer.logger=[jsonl]",
                f"trainer.default_local_dir={run_dir}",
            ],
        )
    )
    print("order:", " ".join(CALLS))
    for name, before, after in MEMORY:
        print(f"{name}: GPU memory in use {before:.2f} GiB -> {after:.2f} GiB")
    step = ["sleep", "train", "wake_up(weights)", "push", "wake_up(kv_cache)", "generate"]
    want = ["generate", *step * STEPS]  # the last generate is the final validation
    freed = [before - after for name, before, after in MEMORY if name == "sleep"]
    ok = CALLS == want and len(freed) == STEPS and min(freed) > 0
    print(
        f"RESULT hybrid-{engine} {'OK' if ok else 'FAIL'} steps={STEPS} "
        f"order={'as-expected' if CALLS == want else 'WRONG'} "
        f"freed_by_sleep_gib={','.join(f'{f:.2f}' for f in freed) or 'none'}"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:5]))
