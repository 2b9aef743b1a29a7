"""``hybridflow train``'s data: the RL data loaders, and the checks that data with images asks of
the rest of the configuration.

Rows with images (verl's multimodal layout, ``docs/vision.md``) train through the built-in
rollout (the plain sampler and the agent loops, synchronous or asynchronous, prefill each prompt
with its pixels) and the actor / reference / critic forward, which take them too. What does not take images yet is refused here, at start-up, with the missing
piece named — never a silent drop of the pixels at step 1.
"""

from __future__ import annotations

from typing import Any

from hybridflow.config import ConfigError, PPOConfig
from hybridflow.data import RLDataset, StatefulDataLoader
from hybridflow.entrypoints.common import build_datasets_validated


def build_loaders(
    config: PPOConfig, tokenizer: Any, processor: Any = None
) -> tuple[StatefulDataLoader, StatefulDataLoader | None]:
    """The training loader (``data.gen_batch_size`` or ``data.train_batch_size`` prompts a
    batch) and the validation loader (None without ``data.val_files``); a data set with images
    is checked against the configuration (:func:`image_training_problems`)."""
    data = config.data
    common: dict[str, Any] = dict(
        prompt_key=data.prompt_key,
        max_prompt_length=data.max_prompt_length,
        truncation=data.truncation,
        filter_overlong_prompts=data.filter_overlong_prompts,
        # the agent loops render the chat messages (tool_agent adds tools and tool turns)
        # reward models re-template responses from the chat messages when their tokenizer differs
        return_raw_chat=(
            data.return_raw_chat or config.actor_rollout_ref.rollout.multi_turn.enable or config.reward_model.enable
        ),
        chat_template_kwargs=dict(data.apply_chat_template_kwargs),
        apply_chat_template=data.apply_chat_template,
        processor=processor,
        image_key=data.image_key,
        video_key=data.video_key,
    )
    limits = {"data.train_files": _samples(data.max_samples), "data.val_files": _samples(data.val_max_samples)}
    files = {"data.train_files": tuple(data.train_files), "data.val_files": tuple(data.val_files)}
    datasets = build_datasets_validated(
        {k: v for k, v in files.items() if v},
        lambda key, key_files: RLDataset(key_files, tokenizer, max_samples=limits[key], **common),
    )
    with_images = [key for key, dataset in datasets.items() if dataset.multimodal]
    problems = image_training_problems(config) if with_images else []
    if problems:
        where = f"{' and '.join(with_images)} {'have' if len(with_images) > 1 else 'has'} rows with images"
        raise ConfigError([f"{where} ({data.image_key!r} column): {problem}" for problem in problems])
    seed = config.trainer.seed if data.seed is None else data.seed
    gen_batch = data.gen_batch_size or data.train_batch_size  # larger only for DAPO dynamic sampling
    train_loader = StatefulDataLoader(datasets["data.train_files"], gen_batch, shuffle=data.shuffle, seed=seed)
    if not data.val_files:
        return train_loader, None
    val = datasets["data.val_files"]
    val_loader = StatefulDataLoader(
        val, data.val_batch_size or len(val), shuffle=data.validation_shuffle, seed=seed, drop_last=False
    )
    return train_loader, val_loader


def _samples(max_samples: int) -> int | None:
    return None if max_samples < 0 else max_samples


def image_training_problems(config: PPOConfig) -> list[str]:
    """What in ``config`` cannot take rows with images yet, one line each naming the setting
    and what is missing (empty: the run can train on them)."""
    arr = config.actor_rollout_ref
    rollout = arr.rollout
    problems = []
    if rollout.name != "torch":
        problems.append(
            f"actor_rollout_ref.rollout.name={rollout.name}: only the built-in rollout (torch) feeds images to "
            "the model; this engine's adapter sends token ids only"
        )
    if rollout.checkpoint_engine.backend == "http":
        problems.append(
            "actor_rollout_ref.rollout.checkpoint_engine.backend=http: a served rollout takes token ids only, "
            "not images"
        )
    if config.distillation.enabled:
        problems.append("distillation: the teachers' forward does not take the rows' images")
    if config.reward_model.enable:
        problems.append("reward_model.enable: reward models do not read the rows' images; score with a rule instead")
    return problems
