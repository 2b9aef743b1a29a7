"""``python -m hybridflow.entrypoints.train [--config FILE] [key=value ...]`` (= ``hybridflow train``).

Parses the config once, builds the data loaders, reward managers and worker groups from it,
and runs :meth:`PPOTrainer.fit`. With no arguments it runs the embedded default: GRPO on the
built-in arithmetic task with SmolLM2-135M-Instruct on the CPU.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from pathlib import Path
from typing import Any

import torch

from hybridflow.config import ConfigError, PPOConfig, load_config
from hybridflow.config.build import to_dict
from hybridflow.config.sources import hydra_config_file
from hybridflow.controller import (
    ClassWithInitArgs,
    ResourcePool,
    colocated_class,
    create_worker_group,
)
from hybridflow.data.io import read_column
from hybridflow.entrypoints.common import check_data_files, resolve_device
from hybridflow.entrypoints.train_data import build_loaders
from hybridflow.models import load_tokenizer, resolve_model_path
from hybridflow.models.processor import load_processor
from hybridflow.reward import CustomRewardFunction, build_reward_manager
from hybridflow.reward.scorers import CODE_SOURCES
from hybridflow.reward.scorers.code import CodeSandboxSpec
from hybridflow.sandbox.isolation import require_isolation
from hybridflow.sandbox.limits import SandboxLimits
from hybridflow.sandbox.local_service import LocalSandboxService
from hybridflow.server.local import LocalServer
from hybridflow.tracking import Tracking
from hybridflow.trainer.core import PPOTrainer
from hybridflow.trainer.phases import WorkerGroups
from hybridflow.trainer.teachers import TeacherGroups, route_rows, teacher_routes
from hybridflow.utils.allocator import keep_freed_memory
from hybridflow.utils.errors import run_main
from hybridflow.view.plot import plot_run
from hybridflow.workers.critic import CriticWorker
from hybridflow.workers.placement import actor_rollout_ref_roles
from hybridflow.workers.reward_model import RewardModelWorker
from hybridflow.workers.rollout.worker import RolloutWorker
from hybridflow.workers.teacher import TeacherWorker


def code_sandbox_spec(config: PPOConfig) -> CodeSandboxSpec:
    """Where code rewards run their tests: ``reward_model.sandbox_fusion.url``, or — when the
    data has code rows — a local ``hybridflow sandbox`` started here (the scorer processes cannot
    give each program its own uid; see sandbox/local_service.py). Weak isolation is refused
    here, at start-up, unless ``reward_model.code.allow_weak_isolation``."""
    rm = config.reward_model
    spec = CodeSandboxSpec(
        url=rm.sandbox_fusion.url,
        max_concurrent=rm.sandbox_fusion.max_concurrent,
        memory_limit_mb=rm.sandbox_fusion.memory_limit_mb,
        timeout_s=rm.code.timeout_s,
        all_or_nothing=rm.code.all_or_nothing,
        allow_weak_isolation=rm.code.allow_weak_isolation,
    )
    if spec.url is None and config.custom_reward_function.path is None:
        files = [*config.data.train_files, *config.data.val_files]
        sources = {s for f in files for s in read_column(os.path.expanduser(f), config.data.reward_fn_key)}
        if sources & set(CODE_SOURCES):
            require_isolation(spec.allow_weak_isolation, "the code reward (reward_model.code.allow_weak_isolation)")
            limits = SandboxLimits(wall_s=spec.timeout_s, memory_mb=spec.memory_limit_mb)
            service = LocalSandboxService(
                limits, max_concurrent=os.cpu_count() or 1, allow_weak_isolation=spec.allow_weak_isolation
            )
            print(f"code rewards: local sandbox service at {service.url} ({service.health['isolation']})")
            spec = dataclasses.replace(spec, url=service.url, token=service.token)
    return spec


def serves_judge(config: PPOConfig) -> bool:
    """verl's generative reward model: ``reward_model.enable`` with a custom reward function, which
    asks the served ``reward_model.model.path`` (at ``reward_router_address``)."""
    return config.reward_model.enable and bool(config.custom_reward_function.path)


def start_judge(config: PPOConfig) -> LocalServer:
    """``hybridflow serve`` of the judge model on a free loopback port."""
    model = config.reward_model.model
    assert model.path is not None  # reward_model.enable needs it (a config rule)
    server = LocalServer(model.path, dtype=model.dtype, trust_remote_code=model.trust_remote_code)
    print(f"judge: {model.path} served at {server.url} (reward_router_address={server.address})")
    return server


def build_reward_fns(config: PPOConfig, tokenizer, judge_address: str | None = None):
    """The training and validation reward managers: one object, as both use the same scorer and
    settings, so the run keeps one set of scoring processes (see ``ScorerPool``). A custom
    reward file is imported in those processes, never here (see ``CustomRewardFunction``).
    ``judge_address``: passed to the custom function as ``reward_router_address`` (verl's name)."""
    custom = config.custom_reward_function
    reward_kwargs = dict(custom.reward_kwargs)
    if judge_address is not None:
        reward_kwargs["reward_router_address"] = judge_address
    compute_score = CustomRewardFunction(custom.path, custom.name, reward_kwargs) if custom.path else None
    rm = config.reward_model
    extra: dict[str, Any] = {}
    if rm.reward_manager == "dapo":
        extra = dict(
            max_resp_len=config.data.max_response_length,
            overlong_buffer_enable=rm.overlong_buffer.enable,
            overlong_buffer_len=rm.overlong_buffer.len,
            overlong_penalty_factor=rm.overlong_buffer.penalty_factor,
            overlong_buffer_log=rm.overlong_buffer.log,
        )
    if rm.num_workers is not None:  # null: each manager's own default
        extra["num_workers"] = rm.num_workers
    extra["code_sandbox"] = code_sandbox_spec(config)
    kwargs = dict(
        compute_score=compute_score,
        reward_fn_key=config.data.reward_fn_key,
        timeout_s=rm.timeout_s,
        memory_limit_mb=rm.memory_limit_mb,
        rule_reward=rm.rule_reward,
        **extra,
    )
    manager = build_reward_manager(rm.reward_manager, tokenizer, **kwargs)
    return manager, manager


@dataclasses.dataclass(frozen=True)
class WorkerSpecs:
    """What :func:`build_workers` starts: the roles colocated per rank, and the groups that get
    processes of their own (None: that role is colocated, or absent)."""

    colocated: dict[str, ClassWithInitArgs]
    rollout: ClassWithInitArgs | None = None
    critic: ClassWithInitArgs | None = None
    # teachers by name: in pools of their own (enable_resource_pool), and in the teachers' shared pool
    own_teachers: dict[str, ClassWithInitArgs] = dataclasses.field(default_factory=dict)
    shared_teachers: dict[str, ClassWithInitArgs] = dataclasses.field(default_factory=dict)


def teacher_role(name: str) -> str:
    """The role name of teacher ``name`` in a colocated group."""
    return f"teacher/{name}"


def teacher_specs(config: PPOConfig, device: str) -> tuple[dict[str, ClassWithInitArgs], ...]:
    """Each teacher's worker, by placement: ``(colocated with the actor, own pool, shared pool)``."""
    dist = config.distillation
    placed: tuple[dict[str, ClassWithInitArgs], ...] = ({}, {}, {})
    if dist.enabled:
        check_teacher_keys(config)  # before any model loads
    for name, teacher in dist.teacher_models.items() if dist.enabled else ():
        spec = ClassWithInitArgs(
            TeacherWorker,
            dist,
            config.actor_rollout_ref,
            device=device,
            student_tokenizer=config.data.tokenizer,
            name=name,
        )
        where = 1 if teacher.enable_resource_pool else (2 if dist.nnodes else 0)
        placed[where][name] = spec
    return placed


def worker_specs(config: PPOConfig, total_steps: int, use_reference: bool, device: str) -> WorkerSpecs:
    """Each role's worker class and arguments, and where it runs (see :func:`build_workers`)."""
    trainer, arr = config.trainer, config.actor_rollout_ref
    # Asynchronous training on Ray: the rollout gets processes of its own (a second pool), so it
    # generates while the actor trains; weights reach it through the controller at each sync.
    separate_rollout = config.async_training.mode != "sync" and trainer.backend == "ray"
    rollout = ClassWithInitArgs(
        RolloutWorker, arr, device=device, seed=trainer.seed, **({"share_name": None} if separate_rollout else {})
    )
    roles_spec = actor_rollout_ref_roles(
        arr,
        rollout=None if separate_rollout else rollout,
        with_ref=use_reference,
        total_training_steps=total_steps,
        device=device,
        seed=trainer.seed,
        distillation=config.distillation,
    )
    colocated_teachers, own_teachers, shared_teachers = teacher_specs(config, device)
    # in the actor's processes, like the reference
    roles_spec.update({teacher_role(name): spec for name, spec in colocated_teachers.items()})
    # filled by resolve_ppo_config (= data.max_prompt_length, data.max_response_length)
    assert arr.rollout.prompt_length is not None and arr.rollout.response_length is not None
    critic_spec = ClassWithInitArgs(
        CriticWorker,
        config.critic,
        rollout_n=arr.rollout.n,
        total_training_steps=total_steps,
        device=device,
        seed=trainer.seed,
        trust_remote_code=arr.model.trust_remote_code,
        max_tokens=arr.rollout.prompt_length + arr.rollout.response_length,
    )
    colocate_critic = config.critic.enable and trainer.critic_placement == "colocated"
    if colocate_critic:
        roles_spec["critic"] = critic_spec
    return WorkerSpecs(
        roles_spec,
        rollout=rollout if separate_rollout else None,
        critic=critic_spec if config.critic.enable and not colocate_critic else None,
        own_teachers=own_teachers,
        shared_teachers=shared_teachers,
    )


def build_workers(config: PPOConfig, total_steps: int, use_reference: bool) -> WorkerGroups:
    """Actor + rollout (+ reference, + distillation teacher) colocated per rank; the critic with
    them (default) or in its own processes (``trainer.critic_placement=separate``); the rollout in
    its own processes for asynchronous training on Ray; a teacher in its own with its
    ``enable_resource_pool``, or in the teachers' shared pool (``distillation.nnodes``)."""
    trainer = config.trainer
    device = resolve_device(trainer.device)
    # use_gpu: on Ray each rank gets its own GPU (CUDA_VISIBLE_DEVICES); the local backend ignores it
    trainer_shape = [trainer.n_gpus_per_node] * trainer.nnodes
    pool = ResourcePool(trainer_shape, use_gpu=device == "cuda")
    if trainer.backend == "ray":
        from hybridflow.controller.ray_backend import init_ray

        init_ray(trainer.ray_address)
    specs = worker_specs(config, total_steps, use_reference, device)
    group = create_worker_group(trainer.backend, pool, colocated_class(specs.colocated))
    roles = group.spawn()
    teachers = [role for role in roles if role.startswith("teacher/")]
    for role in ("actor", "rollout", "ref", *teachers, "critic"):  # actor first: it publishes the live policy
        if role in roles:
            roles[role].init_model()
    owners = [group]

    def own(role: str, spec: ClassWithInitArgs | None, shape: list[int]):
        if spec is None:
            return roles.get(role)
        owners.append(own_worker_group(trainer.backend, shape, spec, device))
        return owners[-1]

    rollout_group = own("rollout", specs.rollout, trainer_shape)
    teacher = build_teacher_groups(config, specs, roles, owners, device)
    rm = build_reward_model_workers(config, device) if config.reward_model.enable and not serves_judge(config) else None
    if rm is not None:
        owners.append(rm)
    critic = own("critic", specs.critic, trainer_shape)  # its own processes: a second resource pool
    return WorkerGroups(
        actor=roles["actor"],
        rollout=rollout_group,
        ref=roles.get("ref"),
        critic=critic,
        rm=rm,
        teacher=teacher,
        owners=owners,
    )


def build_teacher_groups(
    config: PPOConfig, specs: WorkerSpecs, roles: dict[str, Any], owners: list[Any], device: str
) -> TeacherGroups | None:
    """The teachers' handle for phase 4b: those colocated with the actor (``roles``), each one in a
    pool of its own, and those sharing the teachers' pool; groups that own processes join ``owners``."""
    dist, backend = config.distillation, config.trainer.backend
    groups = {name: roles[teacher_role(name)] for name in dist.teacher_models if teacher_role(name) in roles}
    for name, spec in specs.own_teachers.items():
        t = dist.teacher_models[name]
        groups[name] = own_worker_group(backend, [t.n_gpus_per_node] * t.nnodes, spec, device)
        owners.append(groups[name])
    if specs.shared_teachers:
        pool = ResourcePool([dist.n_gpus_per_node] * dist.nnodes, use_gpu=device == "cuda")
        shared = create_worker_group(
            backend, pool, colocated_class({teacher_role(n): s for n, s in specs.shared_teachers.items()})
        )
        owners.append(shared)
        spawned = shared.spawn()
        for name in specs.shared_teachers:
            spawned[teacher_role(name)].init_model()
            groups[name] = spawned[teacher_role(name)]
    if not groups:
        return None
    return TeacherGroups(teacher_routes(dist, groups), config.data.reward_fn_key)


def check_teacher_keys(config: PPOConfig) -> None:
    """Fail at start-up, not at the first step, when a training row's data source has no teacher."""
    routes = teacher_routes(config.distillation, {})
    if len(routes) == 1 and routes[0].key is None:
        return
    files = [os.path.expanduser(f) for f in config.data.train_files]
    route_rows([s for f in files for s in read_column(f, config.data.reward_fn_key)], routes)


def own_worker_group(backend: str, shape: list[int], spec: ClassWithInitArgs, device: str):
    """A worker group in processes of its own (a resource pool of ``shape``), its model loaded."""
    group = create_worker_group(backend, ResourcePool(shape, use_gpu=device == "cuda"), spec)
    group.init_model()
    return group


def build_reward_model_workers(config: PPOConfig, device: str):
    """The reward model's own worker group: on the trainer's pool shape, or its own
    (``reward_model.enable_resource_pool``: ``n_gpus_per_node × nnodes``)."""
    rm, trainer = config.reward_model, config.trainer
    shape = [rm.n_gpus_per_node] * rm.nnodes if rm.enable_resource_pool else [trainer.n_gpus_per_node] * trainer.nnodes
    spec = ClassWithInitArgs(
        RewardModelWorker,
        rm,
        policy_tokenizer=config.data.tokenizer or config.actor_rollout_ref.model.path,
        device=device,
    )
    return own_worker_group(trainer.backend, shape, spec, device)


def other_model_paths(config: PPOConfig) -> list[str]:
    """The model folders / names / Hub ids besides the actor's that this run's workers will load."""
    paths = [config.data.tokenizer, config.critic.model.path]
    if config.reward_model.enable:
        paths += [config.reward_model.model.path, config.reward_model.model.input_tokenizer]
    if config.distillation.enabled:
        paths += [t.model_path for t in config.distillation.teacher_models.values()]
    # a local folder needs nothing fetched (and a tokenizer-only folder has no config.json to check)
    actor = config.actor_rollout_ref.model.path
    return [p for p in dict.fromkeys(paths) if p and p != actor and not Path(p).expanduser().exists()]


def build_trainer(config: PPOConfig) -> PPOTrainer:
    torch.manual_seed(config.trainer.seed)
    check_data_files(
        {"data.train_files": tuple(config.data.train_files), "data.val_files": tuple(config.data.val_files)}
    )
    model_path = resolve_model_path(config.actor_rollout_ref.model.path)
    for other in other_model_paths(config):
        resolve_model_path(other)  # a Hub id is downloaded once here, before any worker or child process reads it
    tokenizer = load_tokenizer(config.data.tokenizer or model_path)
    if config.actor_rollout_ref.model.custom_chat_template is not None:
        # the prompts are rendered here, so the replacement template must reach this tokenizer too
        tokenizer.chat_template = config.actor_rollout_ref.model.custom_chat_template
    processor = load_processor(resolve_model_path(config.data.tokenizer or model_path))
    train_loader, val_loader = build_loaders(config, tokenizer, processor)
    total_steps = config.trainer.total_training_steps or len(train_loader) * config.trainer.total_epochs
    judge = start_judge(config) if serves_judge(config) else None
    reward_fn, val_reward_fn = build_reward_fns(config, tokenizer, judge.address if judge else None)
    assert config.trainer.default_local_dir is not None  # filled when the config is loaded (resolve_ppo_config)
    run_dir = Path(config.trainer.default_local_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    loggers = list(dict.fromkeys([*config.trainer.logger, "jsonl"]))  # jsonl feeds the plot
    tracking = Tracking(
        loggers, run_dir, config.trainer.project_name, config.trainer.experiment_name, config=to_dict(config)
    )
    needs_ref = PPOTrainer.needs_reference(config)
    workers = build_workers(config, total_steps, needs_ref)
    # async_training.mode picks the schedule (trainer/schedules/); the loop is the same for every mode
    trainer = PPOTrainer(
        config, tokenizer, workers, reward_fn, val_reward_fn, train_loader, val_loader, tracking, run_dir, total_steps
    )
    trainer.services += [judge] if judge is not None else []
    return trainer


def run(config: PPOConfig) -> dict[str, float]:
    trainer = build_trainer(config)
    try:
        metrics = trainer.fit()
    finally:
        trainer.close()
    png = plot_run(trainer.run_dir)
    print(f"run folder: {trainer.run_dir} (metrics.jsonl, {png.name}, checkpoints)")
    return metrics


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="hybridflow train", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--config", action="append", default=[], help="YAML config file (repeatable)")
    parser.add_argument("--config-path", default=None, help="hydra style: folder of --config-name")
    parser.add_argument("--config-name", default=None, help="hydra style: NAME[.yaml] in --config-path (read first)")
    parser.add_argument("overrides", nargs="*", help="dotted overrides, e.g. algorithm.adv_estimator=rloo")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    keep_freed_memory()
    try:
        hydra_file = hydra_config_file(args.config_path, args.config_name)
        config = load_config(([hydra_file] if hydra_file else []) + args.config, args.overrides)
    except ConfigError as exc:
        print(f"hybridflow train: invalid config:\n{exc}", file=sys.stderr)
        return 2

    def body() -> int:
        run(config)
        return 0

    return run_main("hybridflow train", body)


if __name__ == "__main__":
    sys.exit(main())
