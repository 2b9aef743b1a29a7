"""What a ``distillation`` section must satisfy, and its derived defaults (see config/distillation.py).

``distillation.teacher_models`` is a map of teacher sections. The schema declares it as one
free-form leaf (the loader keeps it whole), so its entries are read here, key by key, with the
same checks the loader gives a section: types, bounds, verl keys ignored with a warning, unknown
keys with a suggestion.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from hybridflow.algorithms.distillation import DISTILLATION_LOSSES, uses_topk
from hybridflow.config.actor_rollout_ref import RefConfig
from hybridflow.config.build import apply, check_leaves, suggest
from hybridflow.config.distillation import DistillationConfig, TeacherModelConfig
from hybridflow.config.errors import ConfigError
from hybridflow.config.spec import config_fields
from hybridflow.config.verl_compat import find_ignored

if TYPE_CHECKING:
    from hybridflow.config.ppo import PPOConfig

logger = logging.getLogger("hybridflow.config")

_KEY = "distillation"
_LOSS = "distillation.distillation_loss"
_MODELS = "distillation.teacher_models"
LEGACY_TEACHER = "teacher"  # the name the older single ``distillation.teacher_model`` is read under


def parse_teacher_models(raw: Mapping[Any, Any]) -> dict[str, TeacherModelConfig]:
    """Each entry of ``distillation.teacher_models`` as a :class:`TeacherModelConfig` (entries
    already built are kept); raises :class:`ConfigError` naming every bad key."""
    problems: list[str] = []
    teachers: dict[str, TeacherModelConfig] = {}
    for name, entry in raw.items():
        if not isinstance(name, str) or not name:
            problems.append(f"{_MODELS}: teacher names must be non-empty text, got {name!r}")
            continue
        teacher = _parse_teacher(name, entry, problems)
        if teacher is not None:
            teachers[name] = teacher
    if problems:
        raise ConfigError(problems)
    return teachers


def _parse_teacher(name: str, entry: Any, problems: list[str]) -> TeacherModelConfig | None:
    if isinstance(entry, TeacherModelConfig):
        return entry
    path = f"{_MODELS}.{name}"
    if not isinstance(entry, Mapping):
        problems.append(f"{path}: a teacher is a section (model_path, key, ...), got {entry!r}")
        return None
    fields = list(config_fields(TeacherModelConfig))
    kept: dict[str, Any] = {}
    for key, value in entry.items():
        if key in fields:
            kept[key] = value
            continue
        sub = f"{path}.{key}"
        ignored = find_ignored(sub)
        if ignored is not None and ignored.accepts(value):
            logger.warning("ignored: %s (%s)", sub, ignored.reason)
        elif ignored is not None:
            problems.append(f"{sub}: not supported by hybridflow ({ignored.reason})")
        else:
            problems.append(f"{sub}: unknown key{suggest(sub, fields, [f'{path}.{f}' for f in fields])}")
    teacher = apply(TeacherModelConfig(), kept, problems, f"{path}.")
    problems += [f"{path}.{problem}" for problem in check_leaves(teacher)]
    return teacher


def teacher_configs(dist: DistillationConfig) -> dict[str, TeacherModelConfig]:
    """The run's teachers by name: ``teacher_models``, or the one ``teacher_model`` of the older
    layout (named ``teacher``, its key null: every row). Both given is a :class:`ConfigError`."""
    models = parse_teacher_models(dist.teacher_models)
    legacy_given = dist.teacher_model != TeacherModelConfig()
    if models and legacy_given:
        raise ConfigError(
            [
                f"{_KEY}.teacher_model and {_MODELS} both set teachers: give the teachers under {_MODELS}.<name> "
                f"(verl's layout), or the one teacher under {_KEY}.teacher_model"
            ]
        )
    if models:
        return models
    return {LEGACY_TEACHER: dist.teacher_model} if legacy_given else {}


def _resolve_teacher(t: TeacherModelConfig, ref: RefConfig) -> TeacherModelConfig:
    return replace(
        t,
        log_prob_micro_batch_size_per_gpu=t.log_prob_micro_batch_size_per_gpu or ref.log_prob_micro_batch_size_per_gpu,
        log_prob_use_dynamic_bsz=(
            t.log_prob_use_dynamic_bsz if t.log_prob_use_dynamic_bsz is not None else ref.log_prob_use_dynamic_bsz
        ),
        log_prob_max_token_len_per_gpu=t.log_prob_max_token_len_per_gpu or ref.log_prob_max_token_len_per_gpu,
    )


def resolve_distillation(dist: DistillationConfig, ref: RefConfig) -> DistillationConfig:
    """``reward_weight`` null = 1 (0 with verl's ``use_task_rewards=false``); every teacher in
    ``teacher_models`` (the older ``teacher_model`` moved there, so the resolved config names each
    teacher once), its micro-batching null = the (resolved) reference's."""
    use_task = dist.distillation_loss.use_task_rewards
    weight = dist.reward_weight if dist.reward_weight is not None else (0.0 if use_task is False else 1.0)
    teachers = {name: _resolve_teacher(t, ref) for name, t in teacher_configs(dist).items()}
    return replace(dist, reward_weight=float(weight), teacher_models=teachers, teacher_model=TeacherModelConfig())


def rule_distillation(cfg: PPOConfig) -> list[str]:
    """A registered loss that fits the way it is trained; teachers to load, routable by key, and
    placeable (pools)."""
    dist = cfg.distillation
    loss = dist.distillation_loss
    if loss.loss_mode not in DISTILLATION_LOSSES:
        return [
            f"{_LOSS}.loss_mode: unknown distillation loss {loss.loss_mode!r}; valid names: "
            f"{', '.join(DISTILLATION_LOSSES.names())}"
        ]
    problems = []
    if loss.use_task_rewards is False and dist.reward_weight not in (None, 0.0):
        problems.append(
            f"{_LOSS}.use_task_rewards=false means no task reward, but {_KEY}.reward_weight="
            f"{dist.reward_weight}: set one of them"
        )
    if not dist.enabled:
        return problems
    return problems + _loss_problems(dist) + _teacher_problems(dist) + _pool_problems(cfg)


def _loss_problems(dist: DistillationConfig) -> list[str]:
    loss = dist.distillation_loss
    topk = uses_topk(loss.loss_mode)
    problems = []
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
    return problems


def _teacher_problems(dist: DistillationConfig) -> list[str]:
    teachers = dist.teacher_models
    if not teachers:
        return [
            f"{_KEY}.enabled=true needs {_KEY}.teacher_model.model_path or {_MODELS}.<name>.model_path "
            "(an HF model folder with the student's tokenizer)"
        ]
    problems = [f"{_MODELS}.{name}.model_path: missing" for name, t in teachers.items() if not t.model_path]
    if len(teachers) > 1:
        unkeyed = [name for name, t in teachers.items() if t.key is None]
        if unkeyed:
            problems.append(
                f"{_MODELS}: with several teachers each needs a key (the data source it scores); "
                f"{', '.join(unkeyed)} has none"
            )
        keys = [t.key for t in teachers.values() if t.key is not None]
        for key in sorted({k for k in keys if keys.count(k) > 1}):
            owners = ", ".join(name for name, t in teachers.items() if t.key == key)
            problems.append(f"{_MODELS}: teachers {owners} share key {key!r}; each data source has one teacher")
    return problems


def _pool_problems(cfg: PPOConfig) -> list[str]:
    dist, ray = cfg.distillation, cfg.trainer.backend == "ray"
    problems = []
    for name, t in dist.teacher_models.items():
        where = f"{_MODELS}.{name}"
        if t.enable_resource_pool and t.n_gpus_per_node * t.nnodes == 0:
            problems.append(f"{where}.enable_resource_pool=true needs {where}.n_gpus_per_node and nnodes >= 1")
        if t.enable_resource_pool and not ray:
            problems.append(
                f"{where}.enable_resource_pool=true places the teacher in processes of its own: "
                "it needs trainer.backend=ray"
            )
    if (dist.nnodes == 0) != (dist.n_gpus_per_node == 0):
        problems.append(
            f"{_KEY}.nnodes={dist.nnodes} and {_KEY}.n_gpus_per_node={dist.n_gpus_per_node}: the teachers' "
            "shared pool needs both >= 1 (or both 0: no shared pool)"
        )
    elif dist.nnodes and not ray:
        problems.append(
            f"{_KEY}.nnodes/n_gpus_per_node: a pool shared by the teachers runs them in processes of their "
            "own: it needs trainer.backend=ray (0 and 0: the teachers run in the trainer's processes)"
        )
    elif dist.nnodes and all(t.enable_resource_pool for t in dist.teacher_models.values()):
        problems.append(
            f"{_KEY}.nnodes/n_gpus_per_node: a pool shared by the teachers, but every teacher has its own "
            "(enable_resource_pool): set them to 0"
        )
    return problems
