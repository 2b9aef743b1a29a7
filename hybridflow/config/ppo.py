"""The PPO trainer's config: ``data``, ``critic``, ``reward_model``, ``custom_reward_function``,
``algorithm``, ``trainer`` and the root :class:`PPOConfig`.

Keys and defaults follow verl's ``ppo_trainer.yaml`` where verl has them; the defaults describe
the embedded run (one CPU process, SmolLM2-135M-Instruct, GRPO on the built-in arithmetic task).
Deliberate differences from verl: ``algorithm.adv_estimator`` defaults to grpo and
``actor_rollout_ref.rollout.n`` to 4 (GRPO needs groups), ``trainer.n_gpus_per_node`` to 1,
``trainer.logger`` to console only. ``None`` defaults documented as "= <other key>" are filled
in once at load time.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from hybridflow.config.actor_rollout_ref import (
    ActorRolloutRefConfig,
    AttnImplementation,
    Dtype,
    OptimConfig,
    RolloutCorrectionConfig,
)
from hybridflow.config.distillation import DistillationConfig
from hybridflow.config.spec import section, setting


@dataclass(frozen=True)
class DataConfig:
    """``data``: prompt datasets and batch size."""

    tokenizer: str | None = setting(None, "tokenizer folder; null = the model's own tokenizer")
    train_files: tuple[str, ...] = setting(
        factory=lambda: ("~/data/hybridflow/arithmetic/train.parquet",),
        help="training parquet/jsonl file(s); the default is the built-in arithmetic task "
        "(`hybridflow data arithmetic --out ~/data/hybridflow/arithmetic`)",
    )
    val_files: tuple[str, ...] = setting(
        factory=lambda: ("~/data/hybridflow/arithmetic/test.parquet",),
        help="validation parquet/jsonl file(s); empty = no validation",
    )
    prompt_key: str = setting("prompt", "column holding the chat messages of the prompt")
    reward_fn_key: str = setting("data_source", "column that selects the scoring function")
    max_prompt_length: int = setting(128, "prompt tokens after templating; prompts are left-padded to it", ge=1)
    max_response_length: int = setting(32, "max generated tokens per response", ge=1)
    train_batch_size: int = setting(4, "prompts per training step (each sampled rollout.n times)", ge=1)
    gen_batch_size: int | None = setting(
        None,
        "prompts per generation batch; null = train_batch_size. Larger only with algorithm.filter_groups.enable "
        "(DAPO: generate more prompts at once, train on the first train_batch_size groups that vary)",
        ge=1,
    )
    val_batch_size: int | None = setting(None, "prompts per validation batch; null = the whole validation set", ge=1)
    return_raw_chat: bool = setting(False, "also return the untemplated messages (for multi-turn / server rollouts)")
    shuffle: bool = setting(True, "shuffle the training set each epoch")
    validation_shuffle: bool = setting(False, "shuffle the validation set")
    seed: int | None = setting(None, "shuffling seed; null = trainer.seed")
    filter_overlong_prompts: bool = setting(False, "drop prompts longer than max_prompt_length when loading")
    truncation: Literal["error", "left", "right", "middle"] = setting(
        "error", "what to do with a prompt longer than max_prompt_length: error, or cut left/right/middle"
    )
    max_samples: int = setting(-1, "use only the first N training rows; -1 = all", ge=-1)
    val_max_samples: int = setting(-1, "use only the first N validation rows; -1 = all", ge=-1)
    apply_chat_template: bool = setting(
        True,
        "render prompts through the tokenizer's chat template; false = as plain text (the messages' contents "
        "joined by a blank line, or a plain-string prompt column) with the tokenizer's own special tokens, "
        "for base models without a template",
    )
    apply_chat_template_kwargs: dict[str, Any] = setting(
        factory=dict, help="extra keyword arguments for tokenizer.apply_chat_template"
    )
    image_key: str = setting(
        "images",
        "column holding each row's images (verl's multimodal layout: one per `<image>` placeholder of the prompt); "
        "rows with images need a vision-language model with its processor (docs/vision.md)",
    )
    video_key: str = setting(
        "videos", "column holding each row's videos; a row with videos is an error (not supported yet)"
    )


@dataclass(frozen=True)
class CriticModelConfig:
    """``critic.model``: the value model (the policy architecture with a scalar head)."""

    path: str | None = setting(
        None, "critic model (folder, known name or Hub id `org/name[@revision]`); null = actor_rollout_ref.model.path"
    )
    dtype: Dtype | None = setting(None, "critic dtype: auto, fp32 or bf16; null = actor_rollout_ref.model.dtype")
    enable_gradient_checkpointing: bool = setting(False, "recompute activations in backward to save memory")
    use_remove_padding: bool | None = setting(
        None, "pack micro-batch rows without padding (values, critic update); null = actor_rollout_ref.model's"
    )
    attn_implementation: AttnImplementation | None = setting(
        None, "attention kernel: auto, eager or sdpa; null = actor_rollout_ref.model.attn_implementation"
    )
    # verl's critic LoRA keys: its own settings, not the actor's (verl does not inherit them either)
    lora_rank: int = setting(0, "critic LoRA rank; 0 = full fine-tuning (the value head is always trained)", ge=0)
    lora_alpha: float = setting(16.0, "critic LoRA scaling alpha (scale = lora_alpha / lora_rank)", gt=0)
    target_modules: str | tuple[str, ...] = setting(
        "all-linear", "critic modules that get LoRA adapters: `all-linear` or a list of module names"
    )


@dataclass(frozen=True)
class CriticConfig:
    """``critic``: the value function trained for GAE-style estimators."""

    enable: bool | None = setting(None, "train a critic; null = on iff the advantage estimator needs values")
    strategy: str | None = setting(None, "training engine; null = actor_rollout_ref.actor.strategy")
    ppo_mini_batch_size: int | None = setting(None, "prompts per critic step; null = the actor's", ge=1)
    ppo_micro_batch_size_per_gpu: int | None = setting(
        None, "rows per critic pass on one device; null = the actor's", ge=1
    )
    forward_micro_batch_size_per_gpu: int | None = setting(
        None, "rows per forward pass when computing values; null = ppo_micro_batch_size_per_gpu", ge=1
    )
    use_dynamic_bsz: bool | None = setting(None, "token-budget micro-batches; null = the actor's")
    ppo_max_token_len_per_gpu: int = setting(32768, "token budget of one critic micro-batch", ge=1)
    forward_max_token_len_per_gpu: int | None = setting(
        None, "token budget when computing values; null = ppo_max_token_len_per_gpu", ge=1
    )
    ppo_epochs: int | None = setting(None, "passes over each batch; null = the actor's", ge=1)
    shuffle: bool | None = setting(None, "shuffle before mini-batching; null = the actor's")
    data_loader_seed: int | None = setting(None, "seed of that mini-batch shuffle (verl's key); null = trainer.seed")
    cliprange_value: float = setting(0.5, "value clip range ε_v", gt=0)
    loss_agg_mode: str | None = setting(None, "value-loss aggregation; null = the actor's loss_agg_mode")
    grad_clip: float = setting(1.0, "max global gradient norm", gt=0)
    optim: OptimConfig = section(lambda: OptimConfig(lr=1e-5), "critic optimizer (lr defaults to 1e-5)")
    model: CriticModelConfig = section(CriticModelConfig, "critic model")


@dataclass(frozen=True)
class OverlongBufferConfig:
    """``reward_model.overlong_buffer``: DAPO's soft penalty for responses near the length limit."""

    enable: bool = setting(False, "apply the overlong penalty (dapo reward manager)")
    len: int = setting(0, "buffer length L_buf before max_response_length where the penalty ramps up", ge=0)
    penalty_factor: float = setting(1.0, "penalty at the length limit", ge=0)
    log: bool = setting(False, "log the penalty per response")


@dataclass(frozen=True)
class SandboxFusionConfig:
    """``reward_model.sandbox_fusion``: a Sandbox Fusion ``/run_code`` service for code rewards."""

    url: str | None = setting(
        None,
        "service URL (`hybridflow sandbox` or Sandbox Fusion); null = a local `hybridflow sandbox` the trainer starts",
    )
    max_concurrent: int = setting(64, "programs in flight at once per scorer process", ge=1)
    memory_limit_mb: int = setting(1024, "memory cap of one program (MiB)", ge=32)


@dataclass(frozen=True)
class CodeRewardConfig:
    """``reward_model.code``: how the code scorer runs test cases (docs/rewards.md, Code)."""

    timeout_s: float = setting(5.0, "wall-clock limit of one test case (s)", gt=0)
    all_or_nothing: bool = setting(False, "score 1 only when every test passes (false: the fraction passed)")
    allow_weak_isolation: bool = setting(
        False, "run code in the local sandbox even without bubblewrap (process limits only; see docs/sandbox.md)"
    )


@dataclass(frozen=True)
class RewardModelModelConfig:
    """``reward_model.model``: the reward model (docs/reward_models.md)."""

    path: str | None = setting(
        None,
        "a reward-model folder (*ForSequenceClassification, one output, e.g. `hybridflow rm`'s hf/) or Hub id; with "
        "custom_reward_function.path: a causal LM served as a judge at reward_router_address",
    )
    input_tokenizer: str | None = setting(
        None, "tokenizer that decodes the policy's responses for re-templating; null = the policy's"
    )
    dtype: str = setting("auto", "reward model / judge weights: auto (bf16 where the CPU is fast at it), fp32, bf16")
    trust_remote_code: bool = setting(False, "allow custom model code in the reward model's folder")


@dataclass(frozen=True)
class RewardModelConfig:
    """``reward_model``: how responses are scored."""

    enable: bool = setting(False, "score with a reward model (or, with custom_reward_function.path, a served judge)")
    model: RewardModelModelConfig = section(RewardModelModelConfig, "the reward model")
    micro_batch_size_per_gpu: int | None = setting(None, "rows per reward-model forward; null = 4", ge=1)
    use_dynamic_bsz: bool = setting(False, "micro-batches by token budget (forward_max_token_len_per_gpu)")
    forward_max_token_len_per_gpu: int = setting(32768, "token budget of one micro-batch with use_dynamic_bsz", ge=1)
    max_length: int | None = setting(
        None, "longest reward-model input; longer rows keep their last max_length tokens (null = no limit)", ge=2
    )
    rule_reward: Literal["off", "log", "add"] = setting(
        "off",
        "with a reward model: off = its score is the reward (verl); log = also run the rule scorer and "
        "log it (rule_score); add = reward = reward-model score + rule score",
    )
    enable_resource_pool: bool = setting(False, "the reward model on its own resource pool (n_gpus_per_node × nnodes)")
    n_gpus_per_node: int = setting(0, "ranks per node of the reward model's own pool (enable_resource_pool)", ge=0)
    nnodes: int = setting(0, "nodes of the reward model's own pool (enable_resource_pool)", ge=0)
    reward_manager: str = setting("naive", "reward manager in the registry: naive, batch, dapo, prime")
    timeout_s: float = setting(10.0, "seconds one scoring call may take before it scores 0", gt=0)
    num_workers: int | None = setting(
        None, "scorer processes of the reward manager; null = its default (naive, batch, dapo: 1; prime: 4)", ge=1
    )
    memory_limit_mb: int = setting(
        4096, "address space (MiB) each scorer process may add to what it starts with (RLIMIT_AS); 0 = no cap", ge=0
    )
    overlong_buffer: OverlongBufferConfig = section(OverlongBufferConfig, "DAPO overlong penalty")
    sandbox_fusion: SandboxFusionConfig = section(SandboxFusionConfig, "remote code-execution service")
    code: CodeRewardConfig = section(CodeRewardConfig, "code rewards: test cases in the sandbox")


@dataclass(frozen=True)
class CustomRewardFunctionConfig:
    """``custom_reward_function``: a user scoring function in a Python file."""

    path: str | None = setting(None, "Python file defining the scoring function; null = default_compute_score")
    name: str = setting("compute_score", "function name in that file")
    reward_kwargs: dict[str, Any] = setting(factory=dict, help="extra keyword arguments passed to the function")


@dataclass(frozen=True)
class KLControlConfig:
    """``algorithm.kl_ctrl``: the coefficient β of in-reward KL."""

    type: Literal["fixed", "adaptive"] = setting("fixed", "fixed β, or adaptive β steered toward target_kl")
    kl_coef: float = setting(0.001, "β (initial β when adaptive)", ge=0)
    horizon: int = setting(10000, "adaptive: steps over which β adapts", ge=1)
    target_kl: float = setting(0.1, "adaptive: KL the controller aims for", gt=0)


@dataclass(frozen=True)
class PFPPOConfig:
    """``algorithm.pf_ppo``: policy-filtration resampling of rows after advantage estimation."""

    reweight_method: Literal["pow", "max_min", "max_random"] = setting(
        "pow", "row weights: |score|^weight_pow, max_min, or max_random"
    )
    weight_pow: float = setting(2.0, "exponent p of the pow method", gt=0)


@dataclass(frozen=True)
class FilterGroupsConfig:
    """``algorithm.filter_groups``: DAPO dynamic sampling (drop groups whose scores are all equal)."""

    enable: bool = setting(False, "drop zero-variance groups and sample more prompts until the batch is full")
    metric: str = setting(
        "score",
        "per-response value that must vary within a group: score / seq_reward / seq_final_reward (the summed "
        "score; seq_final_reward needs use_kl_in_reward=false) or a key the scorer returns (e.g. acc)",
    )
    max_num_gen_batches: int = setting(0, "give up after this many generation batches; ≤ 0 = no limit")


@dataclass(frozen=True)
class AlgorithmConfig:
    """``algorithm``: advantage estimation and in-reward KL."""

    adv_estimator: str = setting("grpo", "advantage estimator in the registry (gae, grpo, rloo, remax, ...)")
    gamma: float = setting(1.0, "discount factor γ", ge=0, le=1)
    lam: float = setting(1.0, "GAE λ", ge=0, le=1)
    norm_adv_by_std_in_grpo: bool = setting(True, "divide GRPO advantages by the group std (false = Dr.GRPO)")
    use_kl_in_reward: bool = setting(False, "subtract β·KL(π‖π_ref) from the token rewards")
    kl_penalty: str = setting("kl", "KL estimator for in-reward KL: kl/k1, abs, mse/k2, low_var_kl/k3")
    kl_ctrl: KLControlConfig = section(KLControlConfig, "in-reward KL coefficient")
    use_pf_ppo: bool = setting(False, "resample rows by score after advantage estimation (PF-PPO)")
    pf_ppo: PFPPOConfig = section(PFPPOConfig, "PF-PPO reweighting")
    filter_groups: FilterGroupsConfig = section(FilterGroupsConfig, "DAPO dynamic sampling")
    gdpo_reward_keys: tuple[str, ...] = setting(
        factory=tuple, help="gdpo: keys of the scorer's dict normalised separately; empty = the score only"
    )
    gdpo_reward_weights: tuple[float, ...] = setting(factory=tuple, help="gdpo: weight per reward key; empty = all 1")
    rollout_correction: RolloutCorrectionConfig = section(
        RolloutCorrectionConfig, "sampler/trainer mismatch: decoupled IS weights and rejection, or bypass mode"
    )


@dataclass(frozen=True)
class TrainerConfig:
    """``trainer``: the loop, placement, logging and checkpoints."""

    total_epochs: int = setting(1, "passes over the training set", ge=1)
    total_training_steps: int | None = setting(None, "stop after this many steps; null = total_epochs × batches", ge=1)
    project_name: str = setting("hybridflow", "project name (logging, checkpoint folder)")
    experiment_name: str = setting("default", "run name (logging, checkpoint folder)")
    logger: tuple[str, ...] = setting(
        factory=lambda: ("console",), help="tracking backends: console, jsonl, tensorboard, wandb"
    )
    log_val_generations: int = setting(0, "validation generations written to the log each validation", ge=0)
    rollout_data_dir: str | None = setting(
        None,
        "write each step's prompts, responses and scores as JSONL here; null = off, except the main job "
        "(the built-in task's default train_files): default_local_dir/rollouts",
    )
    rollout_token_rows: int = setting(
        0,
        "rows per step of the rollout dump that also carry per-token values (tokens, advantages, log-probs, entropy, "
        "IS weights) for hybridflow view; needs rollout_data_dir",
        ge=0,
        le=256,
    )
    validation_data_dir: str | None = setting(
        None,
        "write validation generations as JSONL here; null = off, except the main job: default_local_dir/validation",
    )
    nnodes: int = setting(1, "machines", ge=1)
    n_gpus_per_node: int = setting(1, "worker processes per machine (GPUs, or CPU processes)", ge=1)
    device: Literal["auto", "cpu", "cuda"] = setting("auto", "device: auto = cuda if available, else cpu")
    backend: Literal["local", "ray"] = setting("local", "worker runtime: local (in-process) or ray")
    critic_placement: Literal["colocated", "separate"] = setting(
        "colocated",
        "critic ranks: in the actor's processes (colocated) or their own processes (separate resource pool)",
    )
    ray_address: str | None = setting(None, "address of a running Ray cluster; null = start a local one")
    seed: int = setting(1, "global seed (model init, sampling, shuffling)")
    balance_batch: bool = setting(True, "reorder rows so data-parallel ranks get similar token counts")
    critic_warmup: int = setting(0, "steps that train only the critic before the actor starts", ge=0)
    val_before_train: bool = setting(True, "validate before the first step")
    val_only: bool = setting(False, "validate once and exit")
    test_freq: int = setting(-1, "validate every N steps; ≤ 0 = only at the end", ge=-1)
    save_freq: int = setting(-1, "checkpoint every N steps; ≤ 0 = never", ge=-1)
    resume_mode: Literal["auto", "disable", "resume_path"] = setting(
        "auto", "auto = newest checkpoint in default_local_dir, disable, or resume_path = resume_from_path"
    )
    resume_from_path: str | None = setting(None, "checkpoint folder (global_step_N) for resume_mode=resume_path")
    default_local_dir: str | None = setting(
        None, "checkpoint root; null = checkpoints/{project_name}/{experiment_name}"
    )
    max_actor_ckpt_to_keep: int | None = setting(None, "keep only the newest N actor checkpoints; null = all", ge=1)
    max_critic_ckpt_to_keep: int | None = setting(None, "keep only the newest N critic checkpoints; null = all", ge=1)


ASYNC_MODES: tuple[str, ...] = ("sync", "one_step_off", "fully_async")


@dataclass(frozen=True)
class AsyncTrainingConfig:
    """``async_training``: generation and training overlap (verl's one-step-off and fully
    asynchronous policies). See docs/async.md."""

    mode: str = setting(
        "sync",
        "sync (generate, then train), one_step_off (the rollout generates step k+1's batch with θ_k while the trainer "
        "computes θ_k+1 from batch k: staleness exactly 1), fully_async (a rollouter streams mini-batches into a "
        "bounded queue; the knobs below)",
    )
    staleness_threshold: int = setting(
        1,
        "fully_async: no trained sample comes from weights more than this many syncs older than the ones being "
        "updated (0 = synchronous on-policy); one_step_off uses 1",
        ge=0,
    )
    trigger_parameter_sync_step: int = setting(
        1, "fully_async: local updates between two weight syncs to the rollout; one_step_off uses 1", ge=1
    )
    require_batches: int = setting(
        1,
        "fully_async: ppo_mini_batch_size prompt groups per local update = require_batches × ppo_mini_batch_size; "
        "one_step_off takes data.train_batch_size",
        ge=1,
    )
    partial_rollout: bool = setting(
        False,
        "fully_async: at a sync, abort the chunk in flight, swap the weights and resume its requests "
        "(each response records the versions of its first and last tokens); false: the chunk finishes first",
    )
    use_rollout_log_probs: bool = setting(
        True,
        "bypass mode: π_old := π_rollout (the sampler's own log-probs), unless algorithm.rollout_correction "
        "sets rollout_is / rollout_rs (decoupled); false keeps the configured correction",
    )


@dataclass(frozen=True)
class PPOConfig:
    """Root config of the PPO/GRPO trainer (``python -m hybridflow.entrypoints.train``, ``hybridflow train``)."""

    data: DataConfig = section(DataConfig, "datasets and batch size")
    actor_rollout_ref: ActorRolloutRefConfig = section(ActorRolloutRefConfig, "policy model: actor, rollout, reference")
    critic: CriticConfig = section(CriticConfig, "value function")
    reward_model: RewardModelConfig = section(RewardModelConfig, "scoring")
    custom_reward_function: CustomRewardFunctionConfig = section(CustomRewardFunctionConfig, "user scoring function")
    algorithm: AlgorithmConfig = section(AlgorithmConfig, "advantage estimation and KL")
    trainer: TrainerConfig = section(TrainerConfig, "loop, placement, logging, checkpoints")
    async_training: AsyncTrainingConfig = section(
        AsyncTrainingConfig, "overlap generation and training (one-step-off, fully async)"
    )
    distillation: DistillationConfig = section(DistillationConfig, "on-policy distillation from a teacher model")
