"""``distillation``: on-policy distillation from frozen teachers (verl's key names).

The student (the actor) samples; a teacher model scores the student's own tokens; the student
is trained towards the teacher's per-token distribution, as a loss term or as a per-token
reward folded into the advantage. Several teachers (``teacher_models.<name>``) each score the
rows of one data source (their ``key``). See docs/distillation.md.
"""

from __future__ import annotations

from dataclasses import dataclass

from hybridflow.config.actor_rollout_ref import Dtype
from hybridflow.config.spec import section, setting


@dataclass(frozen=True)
class TeacherModelConfig:
    """One frozen teacher and where it runs: an entry of ``distillation.teacher_models`` (or the
    single ``distillation.teacher_model`` of the older layout)."""

    model_path: str | None = setting(
        None,
        "teacher model folder (HF layout), a model name known to hybridflow, or a Hub id `org/name[@revision]`; "
        "it must use the student's tokenizer",
    )
    key: str | None = setting(
        None,
        "the data source this teacher scores: rows whose data.reward_fn_key column equals it; "
        "null = every row (only when it is the one teacher)",
    )
    dtype: Dtype = setting("auto", "teacher weights: auto (bf16 where the CPU is fast at it), fp32, bf16")
    trust_remote_code: bool = setting(False, "allow custom model code in the teacher's folder")
    log_prob_micro_batch_size_per_gpu: int | None = setting(
        None, "rows per teacher forward pass; null = actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu", ge=1
    )
    log_prob_use_dynamic_bsz: bool | None = setting(
        None, "token-budget batching of the teacher's forward passes; null = the reference's"
    )
    log_prob_max_token_len_per_gpu: int | None = setting(
        None, "token budget of one teacher forward pass; null = the reference's", ge=1
    )
    enable_resource_pool: bool = setting(
        False, "the teacher on its own resource pool (n_gpus_per_node × nnodes); false: the trainer's pool shape"
    )
    n_gpus_per_node: int = setting(0, "ranks per node of the teacher's own pool (enable_resource_pool)", ge=0)
    nnodes: int = setting(0, "nodes of the teacher's own pool (enable_resource_pool)", ge=0)


@dataclass(frozen=True)
class DistillationLossConfig:
    """``distillation.distillation_loss``: which divergence, and how it reaches the student."""

    loss_mode: str = setting(
        "k3",
        "per-token divergence: a reverse-KL estimator on the sampled token (k1, k2, k3, low_var_kl, ...) "
        "or a top-K loss (forward_kl_topk, jsd_topk)",
    )
    topk: int | None = setting(32, "teacher log-probs kept per position for the top-K losses", ge=1)
    use_policy_gradient: bool = setting(
        False,
        "true: −divergence(ℓ_old, ℓ_teacher) is a per-token reward added to the advantage (estimators only); "
        "false: the divergence is a loss term of the actor, differentiated directly",
    )
    distillation_loss_coef: float = setting(1.0, "weight of the distillation term (advantage or loss)", ge=0)
    use_task_rewards: bool | None = setting(
        None, "verl's switch; false = reward_weight 0 (distillation alone); null = follow reward_weight"
    )
    jsd_beta: float = setting(0.5, "jsd_topk: the mixture M = β·teacher + (1 − β)·student", gt=0, lt=1)
    loss_max_clamp: float | None = setting(None, "clamp each token's divergence to [−c, c]; null = no clamp", gt=0)
    log_prob_min_clamp: float | None = setting(
        None, "clamp student and teacher log-probs from below before an estimator (e.g. −10); null = no clamp"
    )


@dataclass(frozen=True)
class DistillationConfig:
    """``distillation``: train the student on its own samples against a teacher."""

    enabled: bool = setting(False, "distil from the teachers of distillation.teacher_models (or teacher_model)")
    reward_weight: float | None = setting(
        None,
        "weight of the task reward's advantage (0 = distillation alone); null = 1, or 0 when "
        "distillation_loss.use_task_rewards=false",
        ge=0,
    )
    teacher_models: dict[str, TeacherModelConfig] = setting(
        factory=dict,
        help="the teachers by name (verl's layout): teacher_models.<name>.<key> takes the keys of "
        "distillation.teacher_model; each row goes to the teacher whose key is its data source",
    )
    teacher_model: TeacherModelConfig = section(
        TeacherModelConfig,
        "one teacher (the older layout), read as teacher_models.teacher; give this or teacher_models",
    )
    nnodes: int = setting(
        0, "nodes of one resource pool shared by the teachers without a pool of their own (0: no shared pool)", ge=0
    )
    n_gpus_per_node: int = setting(
        0, "ranks per node of the teachers' shared pool (Ray only; 0: they run in the trainer's processes)", ge=0
    )
    distillation_loss: DistillationLossConfig = section(DistillationLossConfig, "the distillation term")
