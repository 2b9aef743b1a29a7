"""What a loaded PPO config must satisfy: registry names and cross-key rules, checked at load.

:func:`finalize_ppo_config` runs three phases; each collects every problem before raising, so a
user sees all mistakes at once:

1. per-key checks: types, declared bounds, and names that must exist in the algorithm registries
   (advantage estimator, policy loss, aggregation mode, KL estimators);
2. :func:`~hybridflow.config.ppo_defaults.resolve_ppo_config`: every ``None`` documented as
   "= <other key>" gets its value, so consumers read plain values (e.g. ``clip_ratio_low`` is a
   float, ``critic.enable`` a bool);
3. cross-key rules (:data:`PPO_RULES`), e.g. batch sizes divide each other.
"""

from __future__ import annotations

from collections.abc import Callable

from hybridflow.algorithms.advantages import ADV_ESTIMATORS, get_estimator_spec
from hybridflow.algorithms.aggregation import LOSS_AGG_MODES
from hybridflow.algorithms.kl import KL_ESTIMATORS
from hybridflow.algorithms.policy_losses import POLICY_LOSSES
from hybridflow.algorithms.rollout_correction import ROLLOUT_RS_OPTIONS
from hybridflow.config.build import finalize_config
from hybridflow.config.distillation_rules import rule_distillation
from hybridflow.config.ppo import PPOConfig
from hybridflow.config.ppo_defaults import resolve_ppo_config

_ARR = "actor_rollout_ref"
_RC = "algorithm.rollout_correction"


def finalize_ppo_config(cfg: PPOConfig) -> PPOConfig:
    """Check ``cfg``, fill in derived defaults, check cross-key rules; raise :class:`ConfigError`."""
    return finalize_config(cfg, resolve_ppo_config, PPO_RULES, checks=(check_registry_names,))


# --- phase 1: names that must exist in the algorithm registries ----------------------------


def _name_problem(path: str, name: str, valid: list[str] | tuple[str, ...], kind: str) -> list[str]:
    if name in valid:
        return []
    return [f"{path}: unknown {kind} {name!r}; valid names: {', '.join(sorted(valid))}"]


def _kl_problem(path: str, name: str) -> list[str]:
    # A trailing "+" selects the straight-through variant of any registered estimator.
    valid = KL_ESTIMATORS.names()
    if name.removesuffix("+") in valid:
        return []
    return [f"{path}: unknown KL estimator {name!r}; valid names: {', '.join(valid)} (each also with a '+' suffix)"]


def check_registry_names(cfg: PPOConfig) -> list[str]:
    """Names that select algorithms must be registered (the error lists the valid ones)."""
    actor = cfg.actor_rollout_ref.actor
    problems = _name_problem(
        "algorithm.adv_estimator", cfg.algorithm.adv_estimator, ADV_ESTIMATORS.names(), "advantage estimator"
    )
    problems += _name_problem(
        f"{_ARR}.actor.policy_loss.loss_mode", actor.policy_loss.loss_mode, POLICY_LOSSES.names(), "policy loss"
    )
    problems += _name_problem(f"{_ARR}.actor.loss_agg_mode", actor.loss_agg_mode, LOSS_AGG_MODES, "loss_agg_mode")
    if cfg.critic.loss_agg_mode is not None:
        problems += _name_problem("critic.loss_agg_mode", cfg.critic.loss_agg_mode, LOSS_AGG_MODES, "loss_agg_mode")
    problems += _kl_problem("algorithm.kl_penalty", cfg.algorithm.kl_penalty)
    problems += _kl_problem(f"{_ARR}.actor.kl_loss_type", actor.kl_loss_type)
    if cfg.algorithm.rollout_correction.bypass_mode and actor.policy_loss.loss_mode not in ("vanilla", "bypass_mode"):
        problems.append(
            f"algorithm.rollout_correction.bypass_mode=true trains with the bypass loss "
            f"(algorithm.rollout_correction.loss_type: ppo_clip or reinforce); it cannot be combined with "
            f"{_ARR}.actor.policy_loss.loss_mode={actor.policy_loss.loss_mode}"
        )
    return problems


# --- phase 3: cross-key rules (each takes a resolved config, returns problems) ----------------


def _world_size(cfg: PPOConfig) -> int:
    return cfg.trainer.nnodes * cfg.trainer.n_gpus_per_node


def _batch_rule(cfg: PPOConfig, role: str, mini: int, micro: int, dynamic: bool) -> list[str]:
    """mini-batch divides the train batch; the per-device micro-batch divides the per-device mini-batch."""
    train = cfg.data.train_batch_size
    n = cfg.actor_rollout_ref.rollout.n
    world = _world_size(cfg)
    if train % mini:
        return [f"{role}.ppo_mini_batch_size={mini} must divide data.train_batch_size={train}"]
    if (mini * n) % world:
        return [
            f"{role}.ppo_mini_batch_size × rollout.n = {mini} × {n} = {mini * n} responses must split evenly "
            f"over nnodes × n_gpus_per_node = {world} processes"
        ]
    per_device = mini * n // world
    if not dynamic and per_device % micro:
        return [
            f"{role}.ppo_micro_batch_size_per_gpu={micro} must divide the per-device mini-batch "
            f"ppo_mini_batch_size × rollout.n ÷ (nnodes × n_gpus_per_node) = {mini} × {n} ÷ {world} = {per_device}"
        ]
    return []


def rule_actor_batches(cfg: PPOConfig) -> list[str]:
    actor = cfg.actor_rollout_ref.actor
    return _batch_rule(
        cfg, f"{_ARR}.actor", actor.ppo_mini_batch_size, actor.ppo_micro_batch_size_per_gpu, actor.use_dynamic_bsz
    )


def rule_critic_batches(cfg: PPOConfig) -> list[str]:
    critic = cfg.critic
    if not critic.enable:
        return []
    # filled by resolve_ppo_config (phase 2) from the actor's
    assert critic.ppo_mini_batch_size is not None and critic.ppo_micro_batch_size_per_gpu is not None
    assert critic.use_dynamic_bsz is not None
    return _batch_rule(
        cfg, "critic", critic.ppo_mini_batch_size, critic.ppo_micro_batch_size_per_gpu, critic.use_dynamic_bsz
    )


def rule_groups(cfg: PPOConfig) -> list[str]:
    name = cfg.algorithm.adv_estimator
    n = cfg.actor_rollout_ref.rollout.n
    if get_estimator_spec(name).requires_groups and n <= 1:
        return [
            f"algorithm.adv_estimator={name} compares responses to the same prompt, so "
            f"{_ARR}.rollout.n must be > 1 (got {n})"
        ]
    return []


def rule_filter_groups(cfg: PPOConfig) -> list[str]:
    fg = cfg.algorithm.filter_groups
    # The filter runs where samples enter the replay buffer, before phase 6 adds the in-reward KL.
    if fg.enable and fg.metric == "seq_final_reward" and cfg.algorithm.use_kl_in_reward:
        return [
            "algorithm.filter_groups.metric=seq_final_reward needs the in-reward KL, which is computed after "
            "the groups are filtered; with algorithm.use_kl_in_reward=true filter on score or a scorer key (acc)"
        ]
    return []


def rule_gen_batch(cfg: PPOConfig) -> list[str]:
    gen, train = cfg.data.gen_batch_size, cfg.data.train_batch_size
    if gen is None or gen == train:
        return []
    if not cfg.algorithm.filter_groups.enable:
        return [
            f"data.gen_batch_size={gen} differs from data.train_batch_size={train}; that only makes sense with "
            "algorithm.filter_groups.enable=true (DAPO dynamic sampling); verl's fully-async files set 1, which "
            "async_training.mode=fully_async reads as null"
        ]
    if gen < train:
        return [f"data.gen_batch_size={gen} must be at least data.train_batch_size={train}"]
    return []


def rule_clipping(cfg: PPOConfig) -> list[str]:
    actor = cfg.actor_rollout_ref.actor
    if actor.clip_ratio_c <= 1:
        return [f"{_ARR}.actor.clip_ratio_c must be > 1 (dual-clip lower bound), got {actor.clip_ratio_c}"]
    return []


def rule_policy_loss(cfg: PPOConfig) -> list[str]:
    actor = cfg.actor_rollout_ref.actor
    pl = actor.policy_loss
    problems = []
    if pl.loss_mode == "dro" and pl.dro_beta <= 0:
        problems.append(f"{_ARR}.actor.policy_loss.dro_beta must be > 0 for loss_mode=dro, got {pl.dro_beta}")
    rc = cfg.algorithm.rollout_correction
    if (rc.bypass_mode or rc.rollout_is or rc.rollout_rs) and not cfg.actor_rollout_ref.rollout.calculate_log_probs:
        mode = "bypass_mode=true" if rc.bypass_mode else ("rollout_is" if rc.rollout_is else "rollout_rs")
        problems.append(
            f"algorithm.rollout_correction.{mode} compares the rollout's log-probs with the policy's: "
            f"set {_ARR}.rollout.calculate_log_probs=true"
        )
    problems += _rejection_test_problems(rc.rollout_rs)
    if pl.clip_cov_lb >= pl.clip_cov_ub:
        problems.append(
            f"{_ARR}.actor.policy_loss.clip_cov_lb ({pl.clip_cov_lb}) must be below clip_cov_ub ({pl.clip_cov_ub})"
        )
    return problems


def _rejection_test_problems(rollout_rs: str | None) -> list[str]:
    if rollout_rs is None:
        return []
    unknown = [test.strip() for test in rollout_rs.split(",") if test.strip() not in ROLLOUT_RS_OPTIONS]
    if not unknown:
        return []
    listed = ", ".join(repr(test) for test in unknown)
    return [f"{_RC}.rollout_rs: unknown test(s) {listed}; valid: {', '.join(ROLLOUT_RS_OPTIONS)}"]


def rule_sampling(cfg: PPOConfig) -> list[str]:
    rollout = cfg.actor_rollout_ref.rollout
    problems = []
    for path, sampling in ((f"{_ARR}.rollout", rollout), (f"{_ARR}.rollout.val_kwargs", rollout.val_kwargs)):
        if sampling.do_sample and sampling.temperature == 0:
            problems.append(
                f"{path}.temperature must be > 0 when {path}.do_sample=true (for greedy decoding set do_sample=false)"
            )
    return problems


def rule_optim(cfg: PPOConfig) -> list[str]:
    problems = []
    optims = ((f"{_ARR}.actor.optim", cfg.actor_rollout_ref.actor.optim), ("critic.optim", cfg.critic.optim))
    for path, optim in optims:
        if len(optim.betas) != 2 or not all(0 <= b < 1 for b in optim.betas):
            problems.append(f"{path}.betas must be two numbers in [0, 1), got {list(optim.betas)}")
    return problems


def rule_data(cfg: PPOConfig) -> list[str]:
    problems = []
    for key in ("max_samples", "val_max_samples"):
        if getattr(cfg.data, key) == 0:
            problems.append(f"data.{key} must be -1 (all rows) or ≥ 1, got 0")
    if not cfg.data.train_files:
        problems.append("data.train_files must name at least one file")
    if not cfg.data.apply_chat_template and cfg.actor_rollout_ref.rollout.multi_turn.enable:
        problems.append(
            "data.apply_chat_template=false cannot be used with actor_rollout_ref.rollout.multi_turn.enable=true: "
            "the agent loops render every turn through the chat template (give the model one with "
            "actor_rollout_ref.model.custom_chat_template)"
        )
    return problems


def rule_algorithm(cfg: PPOConfig) -> list[str]:
    algo = cfg.algorithm
    problems = []
    if algo.gdpo_reward_weights and len(algo.gdpo_reward_weights) != len(algo.gdpo_reward_keys):
        problems.append(
            f"algorithm.gdpo_reward_weights has {len(algo.gdpo_reward_weights)} entries but "
            f"algorithm.gdpo_reward_keys has {len(algo.gdpo_reward_keys)}; give one weight per key (or none)"
        )
    if algo.use_pf_ppo and algo.adv_estimator != "gae":
        problems.append(
            f"algorithm.use_pf_ppo=true resamples rows after GAE (as in verl); with adv_estimator={algo.adv_estimator} "
            "set it to false"
        )
    return problems


def rule_reward_model(cfg: PPOConfig) -> list[str]:
    """A reward model needs weights; its own pool needs a size; a served judge needs a function to ask it."""
    rm = cfg.reward_model
    problems = []
    if rm.model.dtype not in ("auto", "fp32", "bf16"):
        problems.append(f"reward_model.model.dtype must be auto, fp32 or bf16, got {rm.model.dtype!r}")
    if not rm.enable:
        if rm.rule_reward != "off":
            problems.append(f"reward_model.rule_reward={rm.rule_reward} needs reward_model.enable=true")
        return problems
    if not rm.model.path:
        problems.append(
            "reward_model.enable=true needs reward_model.model.path: a reward-model folder (train one with "
            "`hybridflow rm`), or with custom_reward_function.path a judge model to serve"
        )
    if rm.enable_resource_pool and rm.n_gpus_per_node * rm.nnodes == 0:
        problems.append(
            "reward_model.enable_resource_pool=true needs reward_model.n_gpus_per_node and reward_model.nnodes >= 1"
        )
    if cfg.custom_reward_function.path and rm.rule_reward != "off":
        problems.append(
            f"reward_model.rule_reward={rm.rule_reward} combines a reward model's scores with rules; with "
            "custom_reward_function.path the custom function asks the judge and returns the one score: leave it off"
        )
    return problems


def rule_not_yet(cfg: PPOConfig) -> list[str]:
    """Switches of features a later version brings: accepted off (verl's defaults), refused on."""
    problems = []
    mt = cfg.actor_rollout_ref.rollout.multi_turn
    if mt.interaction_config_path:
        problems.append(
            f"{_ARR}.rollout.multi_turn.interaction_config_path: simulated-user interactions are not implemented yet; "
            "leave it null (tool_agent runs tools only)"
        )
    if mt.use_inference_chat_template:
        problems.append(
            f"{_ARR}.rollout.multi_turn.use_inference_chat_template=true is not supported: the agent loop keeps the "
            "model's tokens as sampled and renders only new messages; set it to false"
        )
    if mt.tokenization_sanity_check_mode != "strict":
        problems.append(
            f"{_ARR}.rollout.multi_turn.tokenization_sanity_check_mode={mt.tokenization_sanity_check_mode}: the agent "
            "loop never re-tokenizes and always checks that the chat template is prefix-stable; only 'strict' exists"
        )
    if mt.enable and cfg.actor_rollout_ref.rollout.name not in ("torch", "agent_loop", "vllm", "sglang"):
        problems.append(
            f"{_ARR}.rollout.multi_turn.enable=true runs the agent loop on an inference server: set "
            f"{_ARR}.rollout.name to torch, agent_loop, vllm or sglang (got {cfg.actor_rollout_ref.rollout.name})"
        )
    return problems


def rule_rollout_engine(cfg: PPOConfig) -> list[str]:
    """The rollout engine can run here, and the weight-sync backend has what it needs."""
    from hybridflow.config.actor_rollout_ref import WEIGHT_SYNC_BACKENDS
    from hybridflow.utils.optional_engines import check_engine_installed

    rollout = cfg.actor_rollout_ref.rollout
    ce = rollout.checkpoint_engine
    problems = []
    try:
        check_engine_installed(rollout.name)
    except ValueError as err:
        problems.append(str(err))
    key = f"{_ARR}.rollout.checkpoint_engine"
    if ce.backend not in WEIGHT_SYNC_BACKENDS:
        hint = (
            " (NCCL transfers need GPU processes; on one machine use inproc, across processes http or disk)"
            if ce.backend == "nccl"
            else ""
        )
        problems.append(f"{key}.backend={ce.backend} is not available{hint}; valid: {', '.join(WEIGHT_SYNC_BACKENDS)}")
        return problems
    allowed = {"http": {"url", "api_key", "timeout_s"}, "disk": {"dir"}}.get(ce.backend, set())
    unknown = sorted(set(ce.engine_kwargs) - allowed)
    if unknown:
        problems.append(
            f"{key}.engine_kwargs: {unknown} are not options of backend {ce.backend} "
            f"(it takes {sorted(allowed) or 'none'})"
        )
    if ce.backend == "http" and not ce.engine_kwargs.get("url"):
        problems.append(
            f"{key}.backend=http needs engine_kwargs.url: the `hybridflow serve --control-routes` "
            "address (http://host:port)"
        )
    if rollout.name in ("vllm", "sglang") and ce.backend not in ("naive", "inproc"):
        problems.append(
            f"{_ARR}.rollout.name={rollout.name} takes weights through its own engine: leave "
            f"{key}.backend at naive (or inproc), got {ce.backend}"
        )
    if ce.backend == "http" and rollout.name not in ("torch", "agent_loop"):
        problems.append(
            f"{key}.backend=http generates on a `hybridflow serve` process: {_ARR}.rollout.name "
            f"must be torch (got {rollout.name})"
        )
    return problems


def rule_async_training(cfg: PPOConfig) -> list[str]:
    """Asynchronous training: a known mode, a rollout with its own weights, batch sizes that
    split into the rollouter's chunks, and the features it does not combine with."""
    from hybridflow.config.ppo import ASYNC_MODES

    at, key = cfg.async_training, "async_training"
    if at.mode not in ASYNC_MODES:
        return [f"{key}.mode={at.mode} is unknown; valid: {', '.join(ASYNC_MODES)}"]
    if at.mode == "sync":
        return []
    problems = []
    backend = cfg.actor_rollout_ref.rollout.checkpoint_engine.backend
    if backend == "shared":
        problems.append(
            f"{key}.mode={at.mode} generates while the actor trains: the rollout needs its own weights; "
            f"set {_ARR}.rollout.checkpoint_engine.backend to inproc (or naive, http, disk)"
        )
    if at.partial_rollout and at.mode != "fully_async":
        problems.append(
            f"{key}.partial_rollout=true is for mode=fully_async (one_step_off lets the batch in "
            "flight finish before each sync)"
        )
    rollout = cfg.actor_rollout_ref.rollout
    if at.partial_rollout and (rollout.name not in ("torch", "agent_loop") or backend not in ("inproc", "disk")):
        problems.append(
            f"{key}.partial_rollout=true aborts and resumes the built-in engine in this process: it "
            f"needs {_ARR}.rollout.name=torch and checkpoint_engine.backend inproc or disk"
        )
    mini, batch = cfg.actor_rollout_ref.actor.ppo_mini_batch_size, cfg.data.train_batch_size
    if at.mode == "fully_async" and batch % mini:
        problems.append(
            f"{key}.mode=fully_async streams mini-batches: data.train_batch_size ({batch}) must be a "
            f"multiple of {_ARR}.actor.ppo_mini_batch_size ({mini})"
        )
    if cfg.trainer.backend == "ray" and at.partial_rollout:
        problems.append(
            f"{key}.partial_rollout=true interrupts an engine in the controller's process; with "
            "trainer.backend=ray the rollout has processes of its own: set it to false"
        )
    return problems


def rule_trainer(cfg: PPOConfig) -> list[str]:
    trainer = cfg.trainer
    problems = []
    if trainer.resume_mode == "resume_path" and not trainer.resume_from_path:
        problems.append("trainer.resume_from_path must be set when trainer.resume_mode=resume_path")
    if trainer.backend == "local" and trainer.nnodes > 1:
        problems.append(f"trainer.nnodes={trainer.nnodes} needs trainer.backend=ray (local runs on one machine)")
    if trainer.rollout_token_rows and not trainer.rollout_data_dir:
        problems.append(
            f"trainer.rollout_token_rows={trainer.rollout_token_rows} needs trainer.rollout_data_dir "
            "(the per-token values go into its dump)"
        )
    return problems


PPO_RULES: tuple[Callable[[PPOConfig], list[str]], ...] = (
    rule_actor_batches,
    rule_critic_batches,
    rule_groups,
    rule_filter_groups,
    rule_gen_batch,
    rule_clipping,
    rule_policy_loss,
    rule_sampling,
    rule_optim,
    rule_data,
    rule_algorithm,
    rule_trainer,
    rule_reward_model,
    rule_rollout_engine,
    rule_async_training,
    rule_distillation,
    rule_not_yet,
)
