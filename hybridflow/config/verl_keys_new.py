"""verl keys of its Megatron, async and newer layouts: what hybridflow does with each.

The older table (``verl_compat``) covers verl's ``_generated_ppo_trainer.yaml`` and
``sft_trainer.yaml``; this one adds the keys of verl's ``_generated_ppo_megatron_trainer.yaml``,
``sft_trainer_engine.yaml``, the fully-async and one-step-off Hydra files (verl b178a3c), and
the layout reported from verl main of 2026-08 (issue 30: the root ``reward:`` section,
``model.lora.*``, ``trainer.v1.*``, ``skip.*``, ...). Same rules as there: ignored keys change
nothing that is learned; ``only_when_off`` keys are verl features that would change results and
are not implemented here, accepted only while switched off.
"""

from __future__ import annotations

from hybridflow.config.verl_key_types import IgnoredKey, MovedKey

_ARR = "actor_rollout_ref"
# the model sections with verl's LoRA keys (flat lora_rank, ... and the newer lora.* section)
_LORA_MODELS: tuple[str, ...] = (f"{_ARR}.model", "critic.model")

NEW_MOVED_KEYS: tuple[MovedKey, ...] = (
    # verl main's root ``reward:`` section (issue 30) and its root ``sandbox_fusion``: the older homes
    MovedKey("reward.reward_manager", "reward_manager"),
    MovedKey("reward.reward_model", "reward_model"),
    MovedKey("reward.custom_reward_function", "custom_reward_function"),
    MovedKey("reward.sandbox_fusion", "reward_model.sandbox_fusion"),
    MovedKey("sandbox_fusion", "reward_model.sandbox_fusion"),
    # verl's LoRA section (Megatron's, and newer verl's for every engine) of the actor's and the
    # critic's model; a section with rank 0 is dropped before this
    # (hybridflow.config.verl_keys.adapt_verl_tree)
    *(
        MovedKey(f"{model}.lora.{key}", f"{model}.{flat}")
        for model in _LORA_MODELS
        for key, flat in (
            ("rank", "lora_rank"),
            ("alpha", "lora_alpha"),
            ("target_modules", "target_modules"),
            ("exclude_modules", "exclude_modules"),
            ("adapter_path", "lora_adapter_path"),
        )
    ),
    # the fully-async file mirrors async_training.use_rollout_log_probs onto the actor
    MovedKey(f"{_ARR}.actor.use_rollout_log_probs", "async_training.use_rollout_log_probs"),
)

_MEGATRON = "Megatron-LM setting; no Megatron engine here"
_MULTI_MODAL = "not supported for vision-language models here (images only, through the model folder's processor)"


def _lora_section_keys(model: str) -> tuple[IgnoredKey, ...]:
    """The entries of the ``lora.*`` settings of ``model`` (actor's or critic's) that are not moved."""
    return (
        IgnoredKey(f"{model}.lora.type", "the LoRA variant is plain LoRA", True, off_values=("lora",)),
        IgnoredKey(f"{model}.lora.merge", "merging adapters for the rollout engine; a speed option only"),
        IgnoredKey(f"{model}.lora.dropout", "LoRA dropout is not supported", True, off_values=(0,)),
        IgnoredKey(f"{model}.lora.dropout_position", "LoRA dropout is not supported (position of it)"),
        IgnoredKey(
            f"{model}.lora.lora_*_init_method",
            "Megatron's LoRA initialisers; here A starts as PEFT's (Kaiming-uniform) and B at zero, so the "
            "adapted model starts equal to the base either way",
        ),
        IgnoredKey(f"{model}.lora.a2a_experimental", f"{_MEGATRON} (LoRA communication)"),
        IgnoredKey(f"{model}.lora.dtype", "LoRA weights use the model's dtype", True),
        IgnoredKey(f"{model}.lora.freeze_vision_*", _MULTI_MODAL),
        IgnoredKey(
            f"{model}.lora.freeze_language_model",
            "LoRA always freezes the base model's weights",
            True,
            off_values=(True,),
        ),
    )


NEW_IGNORED_KEYS: tuple[IgnoredKey, ...] = (
    # verl's Megatron optimizer (_generated_ppo_megatron_trainer.yaml) ---------------------------
    IgnoredKey("*.optim.lr_decay_steps", "a decay length other than the whole run is not supported", True),
    IgnoredKey("*.optim.min_lr", "use optim.min_lr_ratio (a fraction of lr)", True, off_values=(0,)),
    IgnoredKey("*.optim.lr_warmup_init", "warm-up starts from a learning rate of 0", True, off_values=(0,)),
    IgnoredKey("*.optim.weight_decay_incr_style", "weight decay is constant", True, off_values=("constant",)),
    IgnoredKey("*.optim.lr_wsd_decay_style", "a setting of Megatron's WSD schedule, which lr_scheduler_type lacks"),
    IgnoredKey("*.optim.lr_wsd_decay_steps", "a setting of Megatron's WSD schedule, which lr_scheduler_type lacks"),
    IgnoredKey(
        "*.optim.use_checkpoint_opt_param_scheduler",
        "the learning-rate schedule is always rebuilt from the config, not read from a checkpoint",
        True,
    ),
    IgnoredKey(
        "*.load_weight",
        "weights always load from the model path; false (random weights) is not supported",
        True,
        off_values=(True,),
    ),
    IgnoredKey(f"{_ARR}.rollout.layer_name_map.*", f"{_MEGATRON} (weight names for the rollout engine)"),
    IgnoredKey("critic.nccl_timeout", "collective timeout of verl's NCCL groups"),
    IgnoredKey("reward_model.nccl_timeout", "collective timeout of verl's NCCL groups"),
    # verl's LoRA section (model.lora.*): rank, alpha, target_modules, exclude_modules and
    # adapter_path move to the model's lora_* keys; a section with rank 0 is dropped
    *(entry for model in _LORA_MODELS for entry in _lora_section_keys(model)),
    # verl's SFT engine file (sft_trainer_engine.yaml) and sft_trainer.yaml -----------------------
    IgnoredKey("data.val_max_samples", "limiting the SFT validation rows is not supported", True, off_values=(-1,)),
    IgnoredKey("data.train_max_samples", "limiting the SFT training rows is not supported", True, off_values=(-1,)),
    IgnoredKey("data.pad_mode", "the engine's padding layout; a speed option only"),
    IgnoredKey(
        "data.ignore_input_ids_mismatch",
        "a multi-turn conversation must tokenize turn by turn as it does whole",
        True,
    ),
    IgnoredKey("checkpoint.*", "checkpoint contents are always model + optimizer + extra state"),
    IgnoredKey("trainer.profile_interval", "verl profiler settings"),
    # verl's fully-async and one-step-off files -------------------------------------------------
    IgnoredKey(
        "async_training.compute_prox_log_prob",
        "recomputing π_old with the trainer's weights: give algorithm.rollout_correction.rollout_is or "
        "rollout_rs (decoupled mode) instead",
        True,
    ),
    IgnoredKey(
        "async_training.use_trainer_do_validate",
        "validation runs in the trainer's loop on the rollout workers (trainer.test_freq)",
    ),
    IgnoredKey(
        "async_training.checkpoint_engine.*",
        "verl's weight-transfer service between rollouter and trainer; the weight sync here is "
        "actor_rollout_ref.rollout.checkpoint_engine",
    ),
    IgnoredKey(
        f"{_ARR}.checkpoint_engine.*",
        "verl's mirror of async_training.checkpoint_engine (weight transfer); the weight sync here is "
        "actor_rollout_ref.rollout.checkpoint_engine",
    ),
    *(
        IgnoredKey(
            f"rollout.{key}",
            "verl's separate rollouter's GPUs; the rollouter here is a thread driving the trainer's own "
            "rollout workers (trainer.nnodes × trainer.n_gpus_per_node)",
        )
        for key in ("nnodes", "n_gpus_per_node")
    ),
    IgnoredKey(
        "rollout.n", "not read by verl's async trainers either; responses per prompt: actor_rollout_ref.rollout.n"
    ),
    IgnoredKey(
        "rollout.total_rollout_steps",
        "the rollouter stops when the trainer does; the run length is trainer.total_training_steps / total_epochs",
    ),
    IgnoredKey("rollout.total_epochs", "passes over the data are trainer.total_epochs"),
    IgnoredKey("rollout.test_freq", "validation runs every trainer.test_freq steps"),
    # verl main of 2026-08 (issue 30's report) ----------------------------------------------------
    IgnoredKey("*.fsdp.*", "FSDP wrapping/offload knobs; hybridflow's engines choose their own sharding"),
    IgnoredKey(
        "trainer.v1.*",
        "settings of verl's trainer V1; hybridflow's one trainer core reads trainer.* and async_training.*",
    ),
    IgnoredKey(
        "skip.*",
        "verl's rollout dump/replay debugging (skipping generation by replaying saved rollouts)",
        True,
        switch_keys=("enable",),
    ),
    IgnoredKey("*.qat.*", "quantization-aware training is not supported", True, switch_keys=("enable",)),
    IgnoredKey("*.pad_to_length", "padding to a fixed length; a speed option only"),
    IgnoredKey("*.entropy_from_logits_chunk_size", "chunked entropy; a memory option only"),
    IgnoredKey(
        f"{_ARR}.rollout.nnodes",
        "the rollout runs on the trainer's workers (trainer.nnodes × trainer.n_gpus_per_node)",
    ),
    IgnoredKey(
        f"{_ARR}.rollout.n_gpus_per_node",
        "the rollout runs on the trainer's workers (trainer.nnodes × trainer.n_gpus_per_node)",
    ),
    IgnoredKey(f"{_ARR}.rollout.full_determinism", "a vLLM/SGLang batch-invariance switch"),
    IgnoredKey(f"{_ARR}.rollout.disaggregation.*", "prefill/decode disaggregation; a speed option only"),
    IgnoredKey(
        "algorithm.filter_groups.max_inflight_gen_batches",
        "generation batches in flight at once; batches here are generated one after another",
    ),
    IgnoredKey("data.audio_key", _MULTI_MODAL),
    IgnoredKey("data.mm_processor_kwargs.*", _MULTI_MODAL),
    IgnoredKey(
        "*.optim.zero_indexed_step",
        "the learning-rate schedule here is zero-indexed: the first update uses its value at step 0",
    ),
)

# LoRA sections (verl's Megatron engine and its newer layout); dropped while rank is 0
LORA_SECTIONS: tuple[str, ...] = tuple(f"{model}.lora" for model in _LORA_MODELS)

# verl's SFT engine file puts the multi-turn columns in data directly
SFT_MOVED_KEYS: tuple[MovedKey, ...] = (
    MovedKey("data.messages_key", "data.multiturn.messages_key"),
    MovedKey("data.tools_key", "data.multiturn.tools_key"),
    MovedKey("data.enable_thinking_key", "data.multiturn.enable_thinking_key"),
)
