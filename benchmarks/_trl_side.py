"""The TRL side of the comparison: ``trl.GRPOTrainer`` (1.16) on the same job.

    python benchmarks/_trl_side.py --settings SETTINGS.json --out RESULT.json

Same model folder, same prompts (the chat messages of the same parquet, in file order), same
reward (hybridflow's scorer for the row's ``data_source``, wrapped as a TRL reward function),
same sampling, optimizer and KL settings (:func:`grpo_config`). A thin subclass times each
generation call and counts the no-grad log-prob passes, so the report states what TRL
actually computed rather than what it is expected to compute.
"""

from __future__ import annotations

import os
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

import torch  # noqa: E402
from trl import GRPOConfig, GRPOTrainer  # noqa: E402
from transformers import TrainerCallback  # noqa: E402

from common import BenchSettings, LearningClock, peak_rss_self_mb, side_main  # noqa: E402
from hybridflow import fields as F  # noqa: E402
from hybridflow.data.io import read_rows  # noqa: E402
from hybridflow.data.schema import PROMPT_KEY  # noqa: E402
from hybridflow.reward import default_compute_score, normalize_result  # noqa: E402

# Update diagnostics kept per step (TRL's logged names; the hybridflow side maps its own to them).
TRAIN_METRICS = ("grad_norm", "kl", "entropy")


def hybridflow_reward(prompts: list, completions: list, **columns: Any) -> list[float]:
    """TRL reward function: hybridflow's ``default_compute_score`` of each completion.

    ``completions`` are chat messages (``[{"role": "assistant", "content": text}]``, TRL's
    form for conversational prompts) or plain strings; ``columns`` carries the dataset's
    ``data_source``, ``reward_model`` (with ``ground_truth``) and ``extra_info`` per row.
    """
    texts = [c[0]["content"] if isinstance(c, list) else c for c in completions]
    scores = []
    for text, source, reward_model, extra in zip(
        texts, columns[F.DATA_SOURCE], columns[F.REWARD_MODEL], columns[F.EXTRA_INFO], strict=True
    ):
        score, _ = normalize_result(default_compute_score(source, text, reward_model["ground_truth"], extra))
        scores.append(score)
    return scores


def load_prompt_dataset(path: str):
    """The parquet's rows as a ``datasets.Dataset`` (``prompt`` = chat messages), file order kept."""
    from datasets import Dataset

    rows = read_rows(path)
    return Dataset.from_list([{key: row[key] for key in (PROMPT_KEY, F.DATA_SOURCE, F.REWARD_MODEL, F.EXTRA_INFO)}
                              for row in rows])


def grpo_config(s: BenchSettings, max_steps: int) -> GRPOConfig:
    """The shared settings as a ``GRPOConfig`` (field names checked against trl 1.16's source).

    One optimizer step per generation batch: ``micro_steps`` micro-batches of ``micro_batch``
    responses, ``gradient_accumulation_steps == steps_per_generation == micro_steps`` and
    ``num_iterations=1`` — which is also when TRL skips a separate old-log-prob pass.
    """
    return GRPOConfig(
        output_dir=str(Path(s.run_dir) / "trl"),
        use_cpu=True,
        report_to="none",
        seed=s.seed,
        data_seed=s.seed,
        bf16=s.dtype == "bf16",  # fp32 master weights, bf16 autocast (as hybridflow's dtype=bf16)
        fp16=False,
        # the attention kernel hybridflow picked for these rows: a kernel choice is no framework win
        model_init_kwargs={"dtype": torch.float32}
        | ({"attn_implementation": s.attn_implementation} if s.attn_implementation != "auto" else {}),
        # equal work: EOS is suppressed until max_completion_length, so every response is full length
        generation_kwargs={"min_new_tokens": s.max_new_tokens} if s.equal_work else None,
        gradient_checkpointing=False,  # TRL's default is True; hybridflow's is False
        learning_rate=s.lr,
        weight_decay=s.weight_decay,
        adam_beta1=0.9,
        adam_beta2=0.999,
        adam_epsilon=1e-8,
        optim="adamw_torch_fused",
        max_grad_norm=s.grad_clip,
        lr_scheduler_type="constant",
        warmup_steps=0,
        per_device_train_batch_size=s.micro_batch,
        gradient_accumulation_steps=s.micro_steps,
        steps_per_generation=s.micro_steps,
        num_iterations=1,
        num_generations=s.samples_per_prompt,
        max_completion_length=s.max_new_tokens,
        temperature=s.temperature,
        top_p=1.0,
        top_k=0,
        beta=s.kl_coef,  # k3 estimator of KL(π‖π_ref), added to the per-token loss
        epsilon=s.clip_ratio,
        loss_type="dapo",  # token-level mean over the whole batch = hybridflow's token-mean
        scale_rewards="group",  # (r − mean) / std per group = grpo with norm_adv_by_std_in_grpo
        shuffle_dataset=False,
        max_steps=max_steps,
        logging_steps=1,
        save_strategy="no",
        disable_tqdm=True,
        dataloader_num_workers=0,
        remove_unused_columns=False,
    )


class TimedGRPOTrainer(GRPOTrainer):
    """``GRPOTrainer`` that times its phases and counts its no-grad log-prob passes.

    Each generation starts a new per-step record (one generation per optimizer step here):
    ``gen`` (``_generate``: chat template, ``generate``, decode), ``reward``
    (``_calculate_rewards``), ``ref`` / ``old_log_prob`` (no-grad log-prob passes of the
    reference / policy model).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.generations: list[dict[str, Any]] = []
        self.no_grad_passes: Counter[str] = Counter()

    def _generate(self, prompts: list):
        start = time.perf_counter()
        out = super()._generate(prompts)
        prompt_ids, completion_ids = out[0], out[1]
        gen_s = time.perf_counter() - start
        self.generations.append(
            {"gen_s": gen_s, "gen_tokens": sum(len(ids) for ids in completion_ids),
             "prompt_ids": [list(map(int, ids)) for ids in prompt_ids], "phases": {"gen": gen_s}}
        )
        return out

    def _add_phase(self, name: str, seconds: float) -> None:
        phases = self.generations[-1]["phases"]
        phases[name] = phases.get(name, 0.0) + seconds

    def _calculate_rewards(self, *args: Any, **kwargs: Any):
        start = time.perf_counter()
        rewards = super()._calculate_rewards(*args, **kwargs)
        self._add_phase("reward", time.perf_counter() - start)
        return rewards

    def _get_per_token_logps_and_entropies(self, model, *args: Any, **kwargs: Any):
        if torch.is_grad_enabled():
            return super()._get_per_token_logps_and_entropies(model, *args, **kwargs)
        role = "ref" if model is self.ref_model else "old_log_prob"
        self.no_grad_passes[role] += 1
        start = time.perf_counter()
        out = super()._get_per_token_logps_and_entropies(model, *args, **kwargs)
        self._add_phase(role, time.perf_counter() - start)
        return out


class StepClock(TrainerCallback):
    """Times each optimizer step (``on_step_begin`` → ``on_step_end``); in the learning mode it
    also evaluates on schedule and stops the run when the training-time budget is spent."""

    def __init__(self, settings: BenchSettings, test_rows: list[dict[str, Any]]) -> None:
        self.settings = settings
        self.test_rows = test_rows
        self.step_times: list[float] = []
        self.evals: list[dict[str, Any]] = []
        self.clock = (LearningClock(settings.budget_s, settings.eval_every_s, settings.start_eval)
                      if settings.budget_s else None)
        self._start = 0.0

    def on_train_begin(self, args, state, control, **kwargs):
        if self.clock is not None and self.settings.start_eval:
            self._eval(kwargs["model"], kwargs["processing_class"])

    def on_step_begin(self, args, state, control, **kwargs):
        self._start = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        step_s = time.perf_counter() - self._start
        self.step_times.append(step_s)
        print(f"[trl] step {state.global_step}: {step_s:.2f} s", flush=True)
        if self.clock is None:
            return control
        self.clock.add(step_s)
        if self.clock.eval_due() or self.clock.done():
            self._eval(kwargs["model"], kwargs["processing_class"])
        if self.clock.done():
            control.should_training_stop = True
        return control

    def _eval(self, model, tokenizer) -> None:
        start = time.perf_counter()
        accuracy = greedy_accuracy(model, tokenizer, self.test_rows, self.settings.max_new_tokens)
        self.evals.append({"train_s": self.clock.train_s, "step": len(self.step_times), "accuracy": accuracy,
                           "eval_s": time.perf_counter() - start})
        print(f"[trl] train {self.clock.train_s:.0f} s, step {len(self.step_times)}: greedy accuracy {accuracy:.3f}",
              flush=True)
        self.clock.mark_evaluated()


def greedy_accuracy(model, tokenizer, rows: list[dict[str, Any]], max_new_tokens: int, batch: int = 64) -> float:
    """Share of ``rows`` solved by greedy completions (HF ``generate``, left-padded batches): the
    scorer's ``acc`` where it returns one, else its score."""
    was_training = model.training
    model.eval()
    tokenizer.padding_side = "left"
    scores = []
    for start in range(0, len(rows), batch):
        chunk = rows[start:start + batch]
        texts = [tokenizer.apply_chat_template(r[PROMPT_KEY], add_generation_prompt=True, tokenize=False) for r in chunk]
        enc = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
        with torch.inference_mode():
            out = model.generate(**enc, max_new_tokens=max_new_tokens, do_sample=False,
                                 pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
        completions = tokenizer.batch_decode(out[:, enc["input_ids"].shape[1]:], skip_special_tokens=True)
        for text, row in zip(completions, chunk, strict=True):
            score, extra = normalize_result(default_compute_score(
                row[F.DATA_SOURCE], text, row[F.REWARD_MODEL]["ground_truth"], row[F.EXTRA_INFO]))
            scores.append(float(extra.get("acc", score)))  # solved or not, as the hybridflow side counts
    model.train(was_training)
    return sum(scores) / len(scores)


def describe_work(trainer: TimedGRPOTrainer, settings: BenchSettings, steps: int) -> list[str]:
    """What TRL computed per step: no-grad passes as counted during the run, the rest from its code."""
    per_step = {role: n / max(steps, 1) for role, n in trainer.no_grad_passes.items()}
    old, ref = per_step.get("old_log_prob", 0.0), per_step.get("ref", 0.0)
    chunks = f"over all {settings.rows_per_step} responses in chunks of {settings.micro_batch}"
    return [
        "rollout: transformers generate (sampling, KV cache)",
        "old log-probs: " + (f"separate no-grad pass {chunks} ({old:g} call(s)/step, counted)" if old
                             else "skipped — on-policy: ℓ_old = detached ℓ of the update forward (counted: 0 passes)"),
        f"reference log-probs: no-grad pass of the reference model {chunks} ({ref:g} call(s)/step, counted)",
        "entropy: computed in every update forward (compute_entropy=True, logged)",
        "rewards: hybridflow's scorer called inline in the trainer process",
    ]


def run(settings: BenchSettings) -> dict[str, Any]:
    torch.set_num_threads(settings.threads)
    setup_start = time.perf_counter()
    learning = settings.budget_s is not None
    clock = StepClock(settings, read_rows(settings.test_file) if learning else [])
    trainer = TimedGRPOTrainer(
        model=settings.model,
        reward_funcs=hybridflow_reward,
        args=grpo_config(settings, max_steps=1_000_000 if learning else settings.total_steps),
        train_dataset=load_prompt_dataset(settings.train_file),
        callbacks=[clock],
    )
    setup_s = time.perf_counter() - setup_start
    trainer.train()
    steps = [
        {"step_s": step_s, "gen_s": gen["gen_s"], "gen_tokens": gen["gen_tokens"], "score_mean": float("nan"),
         "phases": gen["phases"]}
        for step_s, gen in zip(clock.step_times, trainer.generations, strict=False)
    ]
    logged = [entry for entry in trainer.state.log_history if "reward" in entry]  # one per optimizer step
    for record, entry in zip(steps, logged, strict=False):
        record["score_mean"] = entry["reward"]
        record["train"] = {name: entry[name] for name in TRAIN_METRICS}
    first = trainer.generations[0]["prompt_ids"][:: settings.samples_per_prompt] if trainer.generations else None
    self_mb, children_mb = peak_rss_self_mb()
    return {
        "side": "trl", "setup_s": setup_s, "warmup_steps": settings.warmup_steps,
        "rows_per_step": settings.rows_per_step, "steps": steps, "evals": clock.evals,
        "generations_per_step": len(trainer.generations) / max(len(clock.step_times), 1),
        "work": describe_work(trainer, settings, len(clock.step_times)), "first_prompt_ids": first,
        "attn_implementation": trainer.model.config._attn_implementation,
        "peak_rss_self_mb": self_mb, "peak_rss_children_mb": children_mb, "torch_threads": torch.get_num_threads(),
    }


def main(argv: list[str] | None = None) -> int:
    return side_main(run, __doc__, argv)


if __name__ == "__main__":
    sys.exit(main())
