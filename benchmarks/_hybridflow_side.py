"""The hybridflow side of the comparison: the real trainer (``entrypoints.train.build_trainer``) stepping GRPO.

    python benchmarks/_hybridflow_side.py --settings SETTINGS.json --out RESULT.json

Run by ``grpo_vs_trl.py`` / ``learning_vs_trl.py`` in a process of its own. The config is the
default one (GRPO on the built-in arithmetic task) with the shared settings as dotted
overrides (:func:`hybridflow_overrides`); the loop calls :meth:`PPOTrainer.step` exactly as
``PPOTrainer.fit`` does, timing each call.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from common import BenchSettings, LearningClock, peak_rss_self_mb, side_main  # noqa: E402

SCORE_KEY = "critic/score/mean"
VAL_KEY = "val-core/mean"
# Update diagnostics kept per step, under the names the TRL side uses.
TRAIN_METRICS = {"grad_norm": "actor/grad_norm", "kl": "actor/kl_loss", "entropy": "actor/entropy"}


def max_prompt_tokens(tokenizer: Any, files: list[str]) -> int:
    """Longest chat-templated prompt (generation prompt included) over the rows of ``files``.

    ``data.max_prompt_length`` is set to this, as a user would: hybridflow left-pads every
    prompt to that length, TRL pads to the longest prompt of the batch.
    """
    from hybridflow.data.io import read_rows
    from hybridflow.data.schema import PROMPT_KEY

    texts = [
        tokenizer.apply_chat_template(row[PROMPT_KEY], add_generation_prompt=True, tokenize=False)
        for file in files
        for row in read_rows(file)
    ]
    return max(len(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"])


def hybridflow_overrides(s: BenchSettings, max_prompt_length: int) -> list[str]:
    """The shared settings as ``load_config`` overrides (GRPO + k3 KL loss, one update per batch)."""
    learning = s.budget_s is not None
    return [
        f"data.train_files=[{s.train_file}]",
        f"data.val_files=[{s.test_file}]" if learning else "data.val_files=[]",
        f"data.train_batch_size={s.prompts_per_step}",
        f"data.max_prompt_length={max_prompt_length}",
        f"data.max_response_length={s.max_new_tokens}",
        "data.shuffle=false",  # both sides take the file's prompts in order
        f"actor_rollout_ref.model.path={s.model}",
        f"actor_rollout_ref.model.dtype={s.dtype}",
        f"actor_rollout_ref.model.attn_implementation={s.attn_implementation}",
        f"actor_rollout_ref.rollout.ignore_eos={str(s.equal_work).lower()}",  # equal work: every response full length
        "actor_rollout_ref.model.enable_gradient_checkpointing=false",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={s.prompts_per_step}",  # one update per batch
        "actor_rollout_ref.actor.ppo_epochs=1",
        f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={s.micro_batch}",
        f"actor_rollout_ref.actor.optim.lr={s.lr}",
        f"actor_rollout_ref.actor.optim.weight_decay={s.weight_decay}",
        "actor_rollout_ref.actor.optim.lr_scheduler_type=constant",
        f"actor_rollout_ref.actor.clip_ratio={s.clip_ratio}",
        f"actor_rollout_ref.actor.grad_clip={s.grad_clip}",
        "actor_rollout_ref.actor.loss_agg_mode=token-mean",
        "actor_rollout_ref.actor.entropy_coeff=0.0",
        "actor_rollout_ref.actor.use_kl_loss=true",
        "actor_rollout_ref.actor.kl_loss_type=low_var_kl",
        f"actor_rollout_ref.actor.kl_loss_coef={s.kl_coef}",
        f"actor_rollout_ref.rollout.n={s.samples_per_prompt}",
        f"actor_rollout_ref.rollout.temperature={s.temperature}",
        "actor_rollout_ref.rollout.top_p=1.0",
        "actor_rollout_ref.rollout.top_k=-1",
        f"actor_rollout_ref.rollout.seed={s.seed}",
        f"actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu={s.micro_batch}",
        "algorithm.adv_estimator=grpo",
        "algorithm.norm_adv_by_std_in_grpo=true",
        "algorithm.use_kl_in_reward=false",
        f"trainer.seed={s.seed}",
        "trainer.device=cpu",
        "trainer.logger=[jsonl]",
        "trainer.val_before_train=false",
        f"trainer.total_training_steps={s.total_steps if not learning else 1_000_000}",
        f"trainer.default_local_dir={Path(s.run_dir) / 'trainer'}",
    ]


def describe_work(trainer: Any) -> list[str]:
    """What this trainer computes per step, read from the decisions it made in ``__init__``."""
    return [
        "rollout: built-in sampler (rollout.name=" + trainer.config.actor_rollout_ref.rollout.name + ")",
        "old log-probs: " + ("separate no-grad forward (phase old_log_prob)" if trainer.policy_update.compute_old_log_probs
                             else "skipped — on-policy: ℓ_old = detached ℓ of the update forward"),
        "reference log-probs: " + ("no-grad forward of the reference model" if trainer.policy_update.use_reference else "none"),
        "prompt columns: " + (
            "each distinct prompt runs once per batch in the update and in the reference pass, its rows "
            "attending to its keys/values (engine/shared_prompt.py: the same outputs, prompt compute ÷ rollout.n)"
            if shares_prompts_by_config(trainer.config) else "run for every row"
        ),
        "rollout prefill: each distinct prompt once (its samples copy its cache rows), and the prefix every "
        "prompt shares (system prompt, template header) once for the batch",
        "rollout decode: rows that stopped are dropped from the decode batch (none stop in equal-work mode)",
        "micro-batches: rows sorted by length, each micro-batch cut to its longest row",
        "reference: " + ("a frozen bf16 copy of the weights (no per-pass cast of fp32 weights)"
                         if trainer.config.actor_rollout_ref.model.dtype == "bf16" else "the fp32 weights"),
        "entropy: computed in every update forward (logged, no gradient)",
        "rewards: naive manager, scorer in a kept worker process (per-item timeout)",
    ]


def shares_prompts_by_config(config: Any) -> bool:
    """Whether this config's actor and reference run repeated prompts once: the single-process
    engine without gradient checkpointing (the model, a Llama, passes the other checks)."""
    from hybridflow.workers.engine_factory import resolve_strategy

    arr, trainer = config.actor_rollout_ref, config.trainer
    engine = resolve_strategy(arr.actor.strategy, trainer.n_gpus_per_node * trainer.nnodes)
    return engine == "torch" and not arr.model.enable_gradient_checkpointing


def step_record(metrics: dict[str, float], step_s: float, rows: int) -> dict[str, Any]:
    """One step's timings and sizes from the trainer's metrics (response tokens = mean length × rows)."""
    return {
        "step_s": step_s,
        "gen_s": metrics["timing_s/gen"],
        "gen_tokens": int(round(metrics["response_length/mean"] * rows)),
        "score_mean": metrics[SCORE_KEY],
        "train": {name: metrics[key] for name, key in TRAIN_METRICS.items()},
        "phases": {k.removeprefix("timing_s/"): v for k, v in metrics.items() if k.startswith("timing_s/")},
    }


def one_step(trainer: Any, batches: Any, rows: int) -> tuple[dict[str, Any], list[list[int]]]:
    """Next batch → ``trainer.step`` (as ``fit`` does it); returns the record and the prompt ids."""
    from hybridflow.protocol import DataProto

    batch_dict = next(batches)
    prompt_ids = [list(map(int, ids)) for ids in batch_dict["raw_prompt_ids"]]
    trainer.global_steps += 1
    start = time.perf_counter()
    metrics = trainer.step(DataProto.from_single_dict(batch_dict))
    record = step_record(metrics, time.perf_counter() - start, rows)
    print(f"[hybridflow] step {trainer.global_steps}: {record['step_s']:.2f} s (rollout {record['gen_s']:.2f} s, "
          f"{record['gen_tokens']} tokens), reward {record['score_mean']:.3f}", flush=True)
    return record, prompt_ids


def held_out_accuracy(metrics: dict[str, float]) -> float:
    """The share of held-out prompts solved: the scorer's ``acc`` (``val-aux/*/acc/mean@1``, averaged over
    data sources) where it returns one — countdown's score gives 0.1 for a wrong but well-formed equation —
    else the mean score ``val-core/mean``."""
    accs = [v for k, v in metrics.items() if k.startswith("val-aux/") and "/acc/mean@" in k]
    return sum(accs) / len(accs) if accs else metrics[VAL_KEY]


def endless(loader: Any):
    while True:
        yield from loader


def run(settings: BenchSettings) -> dict[str, Any]:
    import torch

    from hybridflow.config import load_config
    from hybridflow.entrypoints.train import build_trainer
    from hybridflow.models import (
        load_tokenizer,
        policy_attn_implementation,
        resolve_model_path,
    )
    from hybridflow.models.packed_attention import base_of

    torch.set_num_threads(settings.threads)
    setup_start = time.perf_counter()
    files = [settings.train_file] + ([settings.test_file] if settings.test_file else [])
    prompt_len = max_prompt_tokens(load_tokenizer(resolve_model_path(settings.model)), files)
    trainer = build_trainer(load_config(None, hybridflow_overrides(settings, prompt_len)))
    setup_s = time.perf_counter() - setup_start
    batches = endless(trainer.train_loader)
    steps, evals, first_prompts = [], [], None
    try:
        if settings.budget_s is None:
            for _ in range(settings.total_steps):
                record, prompts = one_step(trainer, batches, settings.rows_per_step)
                steps.append(record)
                first_prompts = first_prompts or prompts
        else:
            steps, evals = learn(trainer, batches, settings)
    finally:
        trainer.close()
    self_mb, children_mb = peak_rss_self_mb()
    return {
        "side": "hybridflow", "setup_s": setup_s, "warmup_steps": settings.warmup_steps,
        "rows_per_step": settings.rows_per_step, "max_prompt_length": prompt_len, "steps": steps, "evals": evals,
        "work": describe_work(trainer), "first_prompt_ids": first_prompts,
        # the kernel itself (a packed implementation runs it row by row): what TRL is given
        "attn_implementation": base_of(policy_attn_implementation(trainer.config.actor_rollout_ref, "cpu")),
        "peak_rss_self_mb": self_mb, "peak_rss_children_mb": children_mb, "torch_threads": torch.get_num_threads(),
    }


def learn(trainer: Any, batches: Any, settings: BenchSettings) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Train for ``budget_s`` seconds of step time, validating greedily on the test file on schedule."""
    clock = LearningClock(settings.budget_s, settings.eval_every_s, settings.start_eval)
    steps, evals = [], []
    while True:
        if clock.eval_due() or clock.done():
            start = time.perf_counter()
            accuracy = held_out_accuracy(trainer.validate())
            evals.append({"train_s": clock.train_s, "step": len(steps), "accuracy": accuracy,
                          "eval_s": time.perf_counter() - start})
            print(f"[hybridflow] train {clock.train_s:.0f} s, step {len(steps)}: greedy accuracy {accuracy:.3f}", flush=True)
            clock.mark_evaluated()
        if clock.done():
            return steps, evals
        record, _ = one_step(trainer, batches, settings.rows_per_step)
        steps.append(record)
        clock.add(record["step_s"])


def main(argv: list[str] | None = None) -> int:
    return side_main(run, __doc__, argv)


if __name__ == "__main__":
    sys.exit(main())
