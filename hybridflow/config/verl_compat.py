"""verl keys that hybridflow accepts without using, and verl keys that have a new name here.

A verl command line or YAML file often sets keys that only matter to verl's GPU stack (vLLM
memory, tensor parallelism, FSDP offload, profilers, ...). They do not change what is learned,
so loading accepts them with a one-line ``ignored: ...`` warning instead of failing. A key that
is neither ours nor listed here is an error.

A few verl features that do change results are not implemented here; their keys are accepted
only while they are switched off (null, false, empty), so verl's own defaults load, and any real
use is an error that says so.

Patterns are dotted keys; ``*`` matches any run of characters (dots included), and a pattern
ending in ``.*`` also matches the section itself.
"""

from __future__ import annotations

import fnmatch

from hybridflow.config.verl_key_types import IgnoredKey, MovedKey, RenamedKey, is_off
from hybridflow.config.verl_keys_new import NEW_IGNORED_KEYS, NEW_MOVED_KEYS

__all__ = ["IgnoredKey", "MovedKey", "RenamedKey", "is_off"]


_ARR = "actor_rollout_ref"

VERL_IGNORED_KEYS: tuple[IgnoredKey, ...] = (
    IgnoredKey("*._target_", "verl's Hydra instantiation target"),
    IgnoredKey(
        "defaults", "Hydra defaults list; the defaults here already are hybridflow's (the PPO or SFT trainer's)"
    ),
    IgnoredKey("hydra.*", "Hydra runtime settings"),
    IgnoredKey("*.fsdp_config.*", "FSDP wrapping/offload knobs; hybridflow's engines choose their own sharding"),
    IgnoredKey("*.megatron.*", "Megatron-LM settings; no Megatron engine here"),
    IgnoredKey("*.profiler.*", "verl profiler settings"),
    IgnoredKey("global_profiler.*", "verl profiler settings"),
    IgnoredKey("*.checkpoint.*", "checkpoint contents are always model + optimizer + extra state"),
    IgnoredKey(
        f"{_ARR}.actor.use_remove_padding", "verl's copy of actor_rollout_ref.model.use_remove_padding, which is read"
    ),
    IgnoredKey(
        f"{_ARR}.ref.use_remove_padding", "verl's copy of actor_rollout_ref.model.use_remove_padding, which is read"
    ),
    IgnoredKey("*.use_fused_kernels", "fused kernels; a speed option only"),
    IgnoredKey("*.fused_kernel_options.*", "fused kernels; a speed option only"),
    IgnoredKey("*.use_liger", "Liger kernels; a speed option only"),
    IgnoredKey("*.use_shm", "shared-memory model loading; a speed option only"),
    IgnoredKey("*.use_torch_compile", "torch.compile of the loss; a speed option only"),
    IgnoredKey("*.ulysses_sequence_parallel_size", "sequence parallelism is not implemented; memory option only"),
    IgnoredKey("*.enable_activation_offload", "activation offload; a memory option only"),
    IgnoredKey("*.entropy_checkpointing", "entropy recomputation; a memory option only"),
    IgnoredKey("*.override_config.*", "overrides of the HF model config are not applied yet", only_when_off=True),
    IgnoredKey("*.external_lib", "custom-model import hook not supported"),
    IgnoredKey("*.optim.total_training_steps", "derived from trainer.total_training_steps"),
    IgnoredKey(f"{_ARR}.hybrid_engine", "actor, rollout and reference always share the policy model"),
    IgnoredKey(f"{_ARR}.nccl_timeout", "collective timeout of verl's NCCL groups"),
    IgnoredKey(f"{_ARR}.actor.ppo_micro_batch_size", "deprecated global micro-batch; use ppo_micro_batch_size_per_gpu"),
    IgnoredKey(f"{_ARR}.ref.strategy", "the reference runs on the actor's engine"),
    IgnoredKey(
        f"{_ARR}.ref.model",
        "a reference model other than the actor's initial weights is not supported",
        only_when_off=True,
    ),
    IgnoredKey(f"{_ARR}.ref.entropy_from_logits_with_chunking", "the reference computes no entropy"),
    IgnoredKey(f"{_ARR}.*.log_prob_micro_batch_size", "deprecated global micro-batch; use *_per_gpu"),
    IgnoredKey(f"{_ARR}.rollout.mode", "vLLM/SGLang sync or async server mode"),
    IgnoredKey(f"{_ARR}.rollout.data_parallel_size", "inference data parallelism"),
    IgnoredKey(f"{_ARR}.rollout.expert_parallel_size", "inference expert parallelism"),
    IgnoredKey(f"{_ARR}.rollout.pipeline_model_parallel_size", "inference pipeline parallelism"),
    IgnoredKey(f"{_ARR}.rollout.cudagraph_capture_sizes", "vLLM CUDA-graph sizes"),
    IgnoredKey(f"{_ARR}.rollout.layered_summon", "FSDP→vLLM layer-wise weight gathering"),
    IgnoredKey(f"{_ARR}.rollout.engine_kwargs.trtllm", "TensorRT-LLM is not supported", only_when_off=True),
    IgnoredKey(f"{_ARR}.rollout.over_sample_rate", "async over-sampling"),
    IgnoredKey(f"{_ARR}.rollout.multi_stage_wake_up", "vLLM sleep/wake staging"),
    IgnoredKey(
        f"{_ARR}.rollout.agent.num_workers",
        "agent-loop worker processes; each rollout worker runs its rows' loops concurrently on one event loop",
    ),
    IgnoredKey(
        f"{_ARR}.rollout.agent.*",
        "verl's async agent-loop server settings (custom servers are not supported)",
        only_when_off=True,
    ),
    IgnoredKey(f"{_ARR}.rollout.trace.*", "rollout tracing"),
    IgnoredKey(f"{_ARR}.rollout.skip_rollout", "rollout dump/replay debugging"),
    IgnoredKey(f"{_ARR}.rollout.skip_dump_dir", "rollout dump/replay debugging"),
    IgnoredKey("critic.rollout_n", "taken from actor_rollout_ref.rollout.n"),
    IgnoredKey("critic.ppo_micro_batch_size", "deprecated global micro-batch; use ppo_micro_batch_size_per_gpu"),
    IgnoredKey("critic.forward_micro_batch_size", "deprecated global micro-batch; use *_per_gpu"),
    IgnoredKey("critic.model.tokenizer_path", "the critic uses the policy's tokenizer"),
    IgnoredKey("critic.model.trust_remote_code", "taken from actor_rollout_ref.model.trust_remote_code"),
    IgnoredKey("reward_model.strategy", "reward-model engine settings"),
    IgnoredKey(
        "reward_model.micro_batch_size", "deprecated global micro-batch; use reward_model.micro_batch_size_per_gpu"
    ),
    IgnoredKey("reward_model.launch_reward_fn_async", "scoring overlaps nothing here; a speed option only"),
    IgnoredKey("data.use_shm", "shared-memory data loading; a speed option only"),
    IgnoredKey("data.dataloader_num_workers", "rows are read in the trainer process; a loader-speed option only"),
    IgnoredKey("data.return_raw_input_ids", "raw input ids are only needed with a separate reward-model tokenizer"),
    IgnoredKey("data.return_full_prompt", "verl debugging field"),
    IgnoredKey("data.filter_overlong_prompts_workers", "filtering runs in one process"),
    IgnoredKey(
        "data.return_multi_modal_inputs",
        "verl's dataset reads it but no longer uses it; rows with images always carry multi_modal_inputs",
    ),
    IgnoredKey("trainer.esi_redundant_time", "elastic-server checkpoint timing"),
    IgnoredKey("trainer.default_hdfs_dir", "HDFS checkpoint upload"),
    IgnoredKey("trainer.del_local_ckpt_after_load", "HDFS checkpoint handling"),
    IgnoredKey("trainer.ray_wait_register_center_timeout", "verl's Ray registration timeout"),
    IgnoredKey("trainer.use_legacy_worker_impl", "verl worker implementation switch"),
    IgnoredKey(
        "trainer.use_v1",
        "verl's switch to its trainer V1 (a replay buffer feeding one base trainer); "
        "hybridflow has only that design (trainer/core.py), so true and false both run it",
    ),
    IgnoredKey("trainer.profile_steps", "verl profiler settings"),
    IgnoredKey("trainer.profile_continuous_steps", "verl profiler settings"),
    IgnoredKey("trainer.controller_nsight_options.*", "Nsight profiler settings"),
    IgnoredKey("trainer.worker_nsight_options.*", "Nsight profiler settings"),
    IgnoredKey("trainer.npu_profile.*", "NPU profiler settings"),
    IgnoredKey("ray_init.*", "Ray start-up options (use trainer.ray_address for a running cluster)"),
    IgnoredKey("ray_kwargs.*", "Ray start-up options (use trainer.ray_address for a running cluster)"),
    IgnoredKey("transfer_queue.*", "verl data-transfer service"),
    IgnoredKey("data.trust_remote_code", "uses actor_rollout_ref.model.trust_remote_code"),
    IgnoredKey(
        "reward_model.model.external_lib", "model classes come from transformers (trust_remote_code for custom code)"
    ),
    IgnoredKey(
        "reward_model.model.override_config.*", "the reward model's own config is used as saved", only_when_off=True
    ),
    IgnoredKey("reward_model.model.use_remove_padding", "padding-free kernels; a speed option only"),
    IgnoredKey("data.custom_cls.*", "custom dataset classes are not supported", only_when_off=True),
    # verl's sft_trainer.yaml (root-level model / optim / data keys of the SFT trainer)
    IgnoredKey("ulysses_sequence_parallel_size", "sequence parallelism is not implemented; memory option only"),
    IgnoredKey("use_remove_padding", "padding-free kernels; a speed option only"),
    IgnoredKey(
        "data.balance_dp_token",
        "token balancing across data-parallel ranks; ranks take equal contiguous row slices here",
    ),
    IgnoredKey("data.micro_batch_size", "deprecated global micro-batch; use data.micro_batch_size_per_gpu"),
    IgnoredKey("data.chat_template", "use model.custom_chat_template", only_when_off=True),
    IgnoredKey("data.prompt_dict_keys", "nested prompt columns are not supported", only_when_off=True),
    IgnoredKey("data.response_dict_keys", "nested response columns are not supported", only_when_off=True),
    IgnoredKey(
        "data.multiturn.enable_thinking_key",
        "a row's thinking switch is not read; set data.apply_chat_template_kwargs.enable_thinking for all rows",
    ),
    IgnoredKey("data.sampler.*", "custom samplers are not supported", only_when_off=True),
    IgnoredKey("data.datagen.*", "dynamic data generation is not supported", only_when_off=True),
    *(
        IgnoredKey(f"{model}.exclude_modules", "LoRA module exclusion is not supported", only_when_off=True)
        for model in (f"{_ARR}.model", "critic.model")  # the critic's: where verl's critic.model.lora.* moves
    ),
    # verl's current full config (_generated_ppo_trainer.yaml) ----------------------------------
    IgnoredKey(f"{_ARR}.actor.rollout_n", "verl's copy of actor_rollout_ref.rollout.n, which is read"),
    IgnoredKey(f"{_ARR}.ref.rollout_n", "verl's copy of actor_rollout_ref.rollout.n, which is read"),
    IgnoredKey(
        "*.optim.optimizer",
        "the optimizer is torch's AdamW (Megatron's adam decouples weight decay: the same)",
        only_when_off=True,
        off_values=("AdamW", "adam"),
    ),
    IgnoredKey(
        "*.optim.optimizer_impl", "the optimizer is torch's AdamW", only_when_off=True, off_values=("torch.optim",)
    ),
    IgnoredKey(
        "*.optim.override_optimizer_config.*", "extra optimizer arguments are not supported", only_when_off=True
    ),
    IgnoredKey("*.optim.optimizer_offload", "optimizer offload; a memory option only"),
    IgnoredKey(
        f"{_ARR}.actor.freeze_vision_tower", "freezing a VLM's vision tower is not implemented", only_when_off=True
    ),
    IgnoredKey(
        f"{_ARR}.rollout.freeze_vision_tower", "freezing a VLM's vision tower is not implemented", only_when_off=True
    ),
    IgnoredKey(f"{_ARR}.actor.loss_scale_factor", "a loss scale factor is not supported", only_when_off=True),
    IgnoredKey(f"{_ARR}.actor.calculate_entropy", "the entropy metric is computed in every update here"),
    IgnoredKey(f"{_ARR}.actor.use_prefix_grouper", "a prompt repeated across rows always runs once per batch here"),
    IgnoredKey(f"{_ARR}.actor.calculate_sum_pi_squared", "computed exactly when the advantage estimator needs it"),
    IgnoredKey(f"{_ARR}.actor.sum_pi_squared_checkpointing", "recomputation of Σπ²; a memory option only"),
    IgnoredKey(
        "*.router_replay.*",
        "MoE router replay (no MoE support)",
        only_when_off=True,
        off_values=("disabled",),
        switch_keys=("mode",),
    ),
    IgnoredKey(
        f"{_ARR}.rollout.logprobs_mode",
        "vLLM/SGLang log-prob mode; the built-in sampler returns processed log-probs (after temperature)",
        only_when_off=True,
        off_values=("processed_logprobs",),
    ),
    IgnoredKey(f"{_ARR}.rollout.scheduling_policy", "vLLM scheduler policy"),
    IgnoredKey(f"{_ARR}.rollout.skip_tokenizer_init", "vLLM tokenizer start-up switch"),
    IgnoredKey(f"{_ARR}.rollout.enable_rollout_routing_replay", "MoE routing replay", only_when_off=True),
    IgnoredKey(f"{_ARR}.rollout.prometheus.*", "vLLM metrics export"),
    IgnoredKey(f"{_ARR}.rollout.limit_images", "a per-prompt image limit is not implemented", only_when_off=True),
    IgnoredKey("*.quantization", "quantized rollouts are not supported", only_when_off=True),
    IgnoredKey("*.quantization_config_file", "quantized rollouts are not supported", only_when_off=True),
    IgnoredKey("*.mtp.*", "multi-token prediction is not supported", only_when_off=True, switch_keys=("enable",)),
    IgnoredKey(
        f"{_ARR}.rollout.multi_turn.*",
        "a verl multi_turn setting the agent loop does not implement (e.g. num_repeat_rollouts)",
        only_when_off=True,
    ),
    IgnoredKey(f"{_ARR}.model.hf_config_path", "a separate HF config folder is not supported", only_when_off=True),
    IgnoredKey(f"{_ARR}.model.tokenizer_path", "set data.tokenizer for a separate tokenizer", only_when_off=True),
    *(
        IgnoredKey(
            f"{model}.lora_adapter_path", "starting from saved LoRA adapters is not supported", only_when_off=True
        )
        for model in (f"{_ARR}.model", "critic.model")
    ),
    IgnoredKey("*.tiled_mlp.*", "tiled MLP; a memory option only"),
    IgnoredKey(
        "data.tool_config_path",
        "verl's dataset copy of actor_rollout_ref.rollout.multi_turn.tool_config_path, which is the one read",
    ),
    IgnoredKey(
        "data.image_patch_size",
        "images are resized by the model's processor with its own patch size (preprocessor_config.json)",
    ),
    IgnoredKey(
        "reward_model.rollout.*",
        "engine settings of verl's reward-model server; a judge is served by `hybridflow serve` "
        "with reward_model.model.dtype",
    ),
    IgnoredKey(
        "reward_model.use_reward_loop",
        "verl's reward-loop implementation switch; rewards are computed by reward_model.reward_manager here",
    ),
    IgnoredKey(
        "reward_model.reward_loop_source",
        "custom reward-loop classes are not supported",
        only_when_off=True,
        off_values=("register",),
    ),
    IgnoredKey(
        "reward_model.reward_loop_module_path", "custom reward-loop classes are not supported", only_when_off=True
    ),
    IgnoredKey(
        "reward_model.reward_loop_class_name", "custom reward-loop classes are not supported", only_when_off=True
    ),
    IgnoredKey(
        "reward_manager.*",
        "verl's reward-manager section: its name sets reward_model.reward_manager; managers "
        "come from the registry, custom classes (module.path) are not supported",
        only_when_off=True,
        off_values=("register", "custom_reward_manager"),
    ),
    # verl's on-policy distillation section (distillation.*) ---------------------------------------
    IgnoredKey(
        "distillation.num_workers",
        "replicas of verl's teacher server; each teacher here is a worker group on the trainer's pool "
        "shape (or its own, teacher_models.<name>.enable_resource_pool, or the shared distillation.nnodes)",
    ),
    *(
        IgnoredKey(
            f"distillation.{teacher}.inference.*",
            "verl's vLLM teacher-server settings; a teacher here "
            "scores the student's tokens with a forward pass (micro-batching: its log_prob_* keys)",
        )
        for teacher in ("teacher_model", "teacher_models.*")
    ),
    IgnoredKey(
        "distillation.distillation_loss.policy_loss_mode",
        "the folded reward trains through the actor's policy loss (verl supports only vanilla here too)",
        only_when_off=True,
        off_values=("vanilla",),
    ),
    *(
        IgnoredKey(
            f"distillation.distillation_loss.{key}",
            "the folded reward trains through the actor's policy loss "
            "and its clip ratios; verl's separate distillation clip is accepted at its default only",
            only_when_off=True,
            off_values=(0.2,),
        )
        for key in ("clip_ratio", "clip_ratio_low", "clip_ratio_high")
    ),
    *NEW_IGNORED_KEYS,
)


VERL_MOVED_KEYS: tuple[MovedKey, ...] = (
    *NEW_MOVED_KEYS,  # first: verl's newer homes move to the older ones listed below
    MovedKey(f"{_ARR}.actor.optim.clip_grad", f"{_ARR}.actor.grad_clip"),
    MovedKey("critic.optim.clip_grad", "critic.grad_clip"),
    # SAPO's temperatures: verl puts them on the actor, ours sit with the other loss settings
    MovedKey(f"{_ARR}.actor.tau_pos", f"{_ARR}.actor.policy_loss.tau_pos"),
    MovedKey(f"{_ARR}.actor.tau_neg", f"{_ARR}.actor.policy_loss.tau_neg"),
    MovedKey("data.train_max_samples", "data.max_samples"),
    # hybridflow's first home of the rollout-correction keys; verl's (and now ours) is algorithm.rollout_correction
    *(
        MovedKey(f"{_ARR}.actor.policy_loss.rollout_correction.{key}", f"algorithm.rollout_correction.{key}")
        for key in (
            "rollout_is",
            "rollout_is_threshold",
            "rollout_is_batch_normalize",
            "rollout_rs",
            "rollout_rs_threshold",
            "bypass_mode",
            "loss_type",
        )
    ),
    # verl's root reward_manager section names the manager reward_model.reward_manager picks
    MovedKey("reward_manager.name", "reward_model.reward_manager"),
    # verl's first home of the bucket size (before its checkpoint_engine section)
    MovedKey(
        f"{_ARR}.rollout.update_weights_bucket_megabytes",
        f"{_ARR}.rollout.checkpoint_engine.update_weights_bucket_megabytes",
    ),
)


def move_keys(
    tree: dict, problems: list[str], moved: list[tuple[str, str]], table: tuple[MovedKey, ...] | None = None
) -> dict:
    """``tree`` with each ``table`` entry (default :data:`VERL_MOVED_KEYS`) moved to its new place (in place).

    A moved section goes leaf by leaf. Both given with different values is a problem; the same
    value twice is fine (verl's own generated config sets both ``actor.optim.clip_grad`` and
    ``actor.grad_clip``).
    """
    for entry in VERL_MOVED_KEYS if table is None else table:
        *old_parents, old_leaf = entry.old.split(".")
        parent = _walk(tree, old_parents)
        if parent is None or old_leaf not in parent:
            continue
        value = parent.pop(old_leaf)
        if not parent and old_parents:
            _section(tree, old_parents[:-1]).pop(old_parents[-1])  # a section left empty goes too
        for suffix, leaf in _leaves(value):
            _move_leaf(tree, f"{entry.old}{suffix}", f"{entry.new}{suffix}", leaf, (problems, moved))
    return tree


def _leaves(value: object, suffix: str = "") -> list[tuple[str, object]]:
    """(".a.b", leaf) for each leaf of a non-empty map; ("", value) for anything else."""
    if not isinstance(value, dict) or not value:
        return [(suffix, value)]
    return [pair for key, item in value.items() for pair in _leaves(item, f"{suffix}.{key}")]


def _move_leaf(tree: dict, old: str, new: str, value: object, out: tuple[list[str], list[tuple[str, str]]]) -> None:
    if isinstance(value, str) and "${" in value and new in value:
        value = None  # verl's mirror of the key it moves to, e.g. ${oc.select:reward_model.reward_manager,...}
    if value is None:
        return
    *new_parents, new_leaf = new.split(".")
    target = _section(tree, new_parents)
    if new_leaf in target and target[new_leaf] != value:
        given = next((first for first, then in out[1] if then == old), old)  # reward.x moved to x before
        out[0].append(f"{given}={value!r} and {new}={target[new_leaf]!r} set the same thing; give one")
        return
    target[new_leaf] = value
    out[1].append((old, new))


def _walk(tree: dict, parts: list[str]) -> dict | None:
    """The section of ``tree`` at ``parts``, or None where a part is missing or not a section."""
    node = tree
    for part in parts:
        if not isinstance(node.get(part), dict):
            return None
        node = node[part]
    return node


def _section(tree: dict, parts: list[str]) -> dict:
    """The section of ``tree`` at ``parts``, created (replacing any non-section value) where missing."""
    node = tree
    for part in parts:
        if not isinstance(node.get(part), dict):
            node[part] = {}
        node = node[part]
    return node


VERL_RENAMED_KEYS: tuple[RenamedKey, ...] = (
    RenamedKey("*.optim.warmup_style", "lr_scheduler_type"),
    RenamedKey("*.optim.lr_decay_style", "lr_scheduler_type"),  # verl's Megatron optimizer
    # verl's sft_trainer.yaml
    RenamedKey("model.partial_pretrain", "path"),
    RenamedKey("optim.warmup_style", "lr_scheduler_type"),
    RenamedKey("optim.lr_scheduler", "lr_scheduler_type"),
    RenamedKey("optim.warmup_steps_ratio", "lr_warmup_steps_ratio"),
)


def _matches(path: str, pattern: str) -> bool:
    if pattern.endswith(".*") and path == pattern[:-2]:
        return True
    if fnmatch.fnmatchcase(path, pattern):
        return True
    # A section-level pattern also covers the section itself when its prefix has wildcards.
    return pattern.endswith(".*") and fnmatch.fnmatchcase(path, pattern[:-2])


def find_ignored(path: str) -> IgnoredKey | None:
    """The entry listing ``path`` (a verl key hybridflow does not use), or None if it is not listed."""
    for entry in VERL_IGNORED_KEYS:
        if _matches(path, entry.pattern):
            return entry
    return None


def renamed_to(path: str) -> str | None:
    """The new last component for a renamed verl key, or None."""
    for entry in VERL_RENAMED_KEYS:
        if fnmatch.fnmatchcase(path, entry.pattern):
            return entry.new_name
    return None
