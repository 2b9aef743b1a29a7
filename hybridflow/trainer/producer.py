"""The producer side of the trainer: prompts in, generated and scored trajectories out.

Phases 0–2 of the algorithm, the same for every caller — a synchronous step, the
asynchronous rollouter thread, validation and ReMax's greedy baseline::

    0 prepare   a group id (uid) per prompt, n interleaved copies
    1 generate  rollout.generate_sequences, seeded by (trainer.seed, step, generation batch)
    1b baseline ReMax: one greedy response per prompt, scored: each row's baseline b_i
    2 score     reward-model scores (if any), then the reward function → token_level_scores

:meth:`Producer.score` is the one place a reward is computed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from hybridflow import fields as F
from hybridflow.config import PPOConfig
from hybridflow.protocol import DataProto
from hybridflow.protocol.rows import object_array
from hybridflow.reward import reward_fault_metrics
from hybridflow.trainer.metrics import Timer, reduce_metrics

RewardFn = Callable[[DataProto], tuple[torch.Tensor, dict[str, list[Any]]]]


@dataclass
class Produced:
    """One generated, scored prompt batch: ``batch`` (prompts × n rows) and the generation-side
    metrics (the rollout's own, the reward's fault counters)."""

    batch: DataProto
    metrics: dict[str, float] = field(default_factory=dict)


@dataclass
class Producer:
    """Generates and scores prompt batches with the rollout workers and the reward function."""

    config: PPOConfig
    tokenizer: Any
    rollout: Any
    reward_fn: RewardFn
    val_reward_fn: RewardFn
    rm: Any | None = None  # reward-model workers; their rm_scores feed the reward manager
    reward_baselines: bool = False  # ReMax: a greedy baseline pass per batch

    def produce(self, prompts: DataProto, step: int, gen_batch: int, timer: Timer) -> Produced:
        """Phases 0–2 on one prompt batch of step ``step`` (``gen_batch``: its number within the
        step; DAPO's further batches and an asynchronous step's chunks have their own seeds)."""
        metrics: dict[str, float] = {}
        batch = self.prepare(prompts, self.config.actor_rollout_ref.rollout.n, step, gen_batch)
        with timer.phase("gen"):
            batch, rollout_metrics = self.generate(batch, self.sampling_meta(step, gen_batch))
        metrics |= rollout_metrics  # agent loops: num_turns/*, tool_call_counts/*, ...
        if self.reward_baselines:
            with timer.phase("gen_baseline"):
                self.add_reward_baselines(batch, step)
        with timer.phase("reward"):
            scores, extra = self.score(batch)
            metrics |= self.attach_scores(batch, scores, extra)
        return Produced(batch, metrics)

    @staticmethod
    def prepare(batch: DataProto, n: int, step: int, gen_batch: int = 0) -> DataProto:
        """0: a group id per prompt (deterministic: step, generation batch and row), then n
        interleaved copies."""
        prefix = f"{step}" if gen_batch == 0 else f"{step}.{gen_batch}"
        batch.non_tensor_batch[F.UID] = np.array([f"{prefix}-{i}" for i in range(len(batch))], dtype=object)
        return batch.repeat(repeat_times=n, interleave=True)

    def sampling_meta(self, step: int, gen_batch: int = 0, validate: bool = False) -> dict[str, Any]:
        """The rollout call's sampling facts; the seed is a function of (trainer.seed, step,
        generation batch, validate), so a resumed run samples what the first run sampled."""
        seed = self.config.trainer.seed * 1_000_003 + step * 2 + int(validate)
        if gen_batch:
            seed = int(np.random.SeedSequence([self.config.trainer.seed, step, gen_batch]).generate_state(1)[0])
        meta: dict[str, Any] = {
            F.META_EOS_TOKEN_ID: self.tokenizer.eos_token_id,
            F.META_PAD_TOKEN_ID: self.tokenizer.pad_token_id,
            F.META_SEED: seed,
            F.META_VALIDATE: validate,
        }
        if self.config.data.apply_chat_template_kwargs:  # an agent loop renders turns as the dataset did
            meta[F.META_CHAT_TEMPLATE_KWARGS] = dict(self.config.data.apply_chat_template_kwargs)
        if validate:
            vk = self.config.actor_rollout_ref.rollout.val_kwargs
            meta |= {
                F.META_DO_SAMPLE: vk.do_sample,
                F.META_TEMPERATURE: vk.temperature,
                F.META_TOP_P: vk.top_p,
                F.META_TOP_K: vk.top_k,
            }
        return meta

    def generate(self, batch: DataProto, meta: dict[str, Any]) -> tuple[DataProto, dict[str, float]]:
        """1: one response per row; returns the batch with the rollout's columns and the
        rollout's metrics (one list per key when several ranks generated, reduced here)."""
        prompts = batch.pop(batch_keys=[F.INPUT_IDS, F.ATTENTION_MASK, F.POSITION_IDS])
        # The rows' columns travel too (an agent loop reads raw_prompt, agent_name, tools_kwargs, ...);
        # the rollout returns them unchanged, so the union below finds them equal.
        prompts.non_tensor_batch.update(batch.non_tensor_batch)
        prompts.meta_info.update(meta)
        output, rollout_metrics = self.rollout.generate_sequences(prompts)
        if (
            not self.config.actor_rollout_ref.rollout.calculate_log_probs
            and F.ROLLOUT_LOG_PROBS in output.require_batch().keys()
        ):
            output.pop(batch_keys=[F.ROLLOUT_LOG_PROBS])  # kept only when asked for (verl's calculate_log_probs)
        rollout_metrics = reduce_metrics(rollout_metrics)
        return output.union(batch), rollout_metrics

    def score(self, batch: DataProto, validate: bool = False) -> tuple[torch.Tensor, dict[str, list[Any]]]:
        """2: (B, T) token-level scores and the scorer's per-response extras — reward-model
        scores first when there are reward-model workers (the manager reads them)."""
        if self.rm is not None:
            batch = batch.union(self.rm.compute_rm_score(batch))
        return (self.val_reward_fn if validate else self.reward_fn)(batch)

    @staticmethod
    def attach_scores(batch: DataProto, scores: torch.Tensor, extra: dict[str, list[Any]]) -> dict[str, float]:
        """token_level_scores into the batch; the scorer's per-response values as columns (as
        in verl), so row reordering and selection keep them aligned. Returns fault counts."""
        batch.require_batch()[F.TOKEN_LEVEL_SCORES] = scores
        clash = sorted(set(extra) & set(batch.non_tensor_batch))
        if clash:
            raise ValueError(f"the reward function returned keys {clash} that are already batch columns")
        for key, values in extra.items():
            batch.non_tensor_batch[key] = object_array(values)
        return reward_fault_metrics(extra)

    def add_reward_baselines(self, batch: DataProto, step: int) -> None:
        """1b (ReMax): score one greedy response per prompt; it is each row's baseline b_i."""
        n = self.config.actor_rollout_ref.rollout.n
        firsts = batch.select_idxs(np.arange(0, len(batch), n))
        width = firsts.require_batch()[F.PROMPTS].shape[1]
        greedy_in = DataProto.from_dict(
            tensors={
                F.INPUT_IDS: firsts.require_batch()[F.PROMPTS],
                F.ATTENTION_MASK: firsts.require_batch()[F.ATTENTION_MASK][:, :width],
                F.POSITION_IDS: firsts.require_batch()[F.POSITION_IDS][:, :width],
            },
            non_tensors=dict(firsts.non_tensor_batch),  # an agent loop reads raw_prompt, agent_name, ...
        )
        greedy, _ = self.generate(greedy_in, {**self.sampling_meta(step), F.META_DO_SAMPLE: False})
        scores, _ = self.score(greedy)
        batch.require_batch()[F.REWARD_BASELINES] = scores.sum(-1).repeat_interleave(n)
