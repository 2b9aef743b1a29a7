"""What a ``distillation`` section must satisfy, and its derived defaults (see config/distillation.py)."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from hybridflow.algorithms.distillation import DISTILLATION_LOSSES, uses_topk
from hybridflow.config.actor_rollout_ref import RefConfig
from hybridflow.config.distillation import DistillationConfig

if TYPE_CHECKING:
    from hybridflow.config.ppo import PPOConfig

_KEY = "distillation"
_LOSS = "distillation.distillation_loss"


def resolve_distillation(dist: DistillationConfig, ref: RefConfig) -> DistillationConfig:
    """``reward_weight`` null = 1 (0 with verl's ``use_task_rewards=false``); the teacher's
    micro-batching null = the (resolved) reference's."""
    use_task = dist.distillation_loss.use_task_rewards
    weight = dist.reward_weight if dist.reward_weight is not None else (0.0 if use_task is False else 1.0)
    t = dist.teacher_model
    teacher = replace(
        t,
        log_prob_micro_batch_size_per_gpu=t.log_prob_micro_batch_size_per_gpu or ref.log_prob_micro_batch_size_per_gpu,
        log_prob_use_dynamic_bsz=(
            t.log_prob_use_dynamic_bsz if t.log_prob_use_dynamic_bsz is not None else ref.log_prob_use_dynamic_bsz
        ),
        log_prob_max_token_len_per_gpu=t.log_prob_max_token_len_per_gpu or ref.log_prob_max_token_len_per_gpu,
    )
    return replace(dist, reward_weight=float(weight), teacher_model=teacher)


def rule_distillation(cfg: PPOConfig) -> list[str]:
    """A teacher to load, a registered loss, and a loss that fits the way it is trained."""
    dist = cfg.distillation
    loss = dist.distillation_loss
    problems = []
    if loss.loss_mode not in DISTILLATION_LOSSES:
        return [
            f"{_LOSS}.loss_mode: unknown distillation loss {loss.loss_mode!r}; valid names: "
            f"{', '.join(DISTILLATION_LOSSES.names())}"
        ]
    if loss.use_task_rewards is False and dist.reward_weight not in (None, 0.0):
        problems.append(
            f"{_LOSS}.use_task_rewards=false means no task reward, but {_KEY}.reward_weight="
            f"{dist.reward_weight}: set one of them"
        )
    if not dist.enabled:
        return problems
    if not dist.teacher_model.model_path:
        problems.append(
            f"{_KEY}.enabled=true needs {_KEY}.teacher_model.model_path (an HF model folder with the "
            "student's tokenizer)"
        )
    topk = uses_topk(loss.loss_mode)
    if topk and loss.use_policy_gradient:
        problems.append(
            f"{_LOSS}.loss_mode={loss.loss_mode} compares whole top-K distributions, which a per-token "
            f"reward cannot carry: set {_LOSS}.use_policy_gradient=false (a loss term)"
        )
    if topk and not loss.topk:
        problems.append(f"{_LOSS}.loss_mode={loss.loss_mode} needs {_LOSS}.topk >= 1")
    if not loss.use_policy_gradient and loss.loss_mode in ("k1", "kl"):
        problems.append(
            f"{_LOSS}.loss_mode={loss.loss_mode} as a loss term has a gradient that does not depend on "
            "the teacher (∇(ℓ − ℓ_T) = ∇ℓ): use it with use_policy_gradient=true, or k3 / forward_kl_topk"
        )
    t = dist.teacher_model
    if t.enable_resource_pool and t.n_gpus_per_node * t.nnodes == 0:
        problems.append(
            f"{_KEY}.teacher_model.enable_resource_pool=true needs {_KEY}.teacher_model.n_gpus_per_node and nnodes >= 1"
        )
    if t.enable_resource_pool and cfg.trainer.backend != "ray":
        problems.append(
            f"{_KEY}.teacher_model.enable_resource_pool=true places the teacher in processes of its own: "
            "it needs trainer.backend=ray"
        )
    return problems
