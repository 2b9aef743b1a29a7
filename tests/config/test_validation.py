"""Every validation rule has a failing case whose message names the key and says why."""

from __future__ import annotations

import pytest

from hybridflow.config import ConfigError, DataConfig, PPOConfig, finalize_ppo_config, load_config

ARR = "actor_rollout_ref"


def problems(*overrides: str) -> list[str]:
    with pytest.raises(ConfigError) as info:
        load_config(None, list(overrides))
    return info.value.problems


def only_problem(*overrides: str) -> str:
    found = problems(*overrides)
    assert len(found) == 1, found
    return found[0]


# --- unknown keys ------------------------------------------------------------------------------


def test_unknown_key_suggests_the_sibling_with_a_similar_name():
    assert only_problem(f"{ARR}.rollout.tempreature=0.5") == (
        f"{ARR}.rollout.tempreature: unknown key; did you mean {ARR}.rollout.temperature?"
    )


def test_key_in_the_wrong_section_suggests_where_it_lives():
    assert only_problem(f"{ARR}.actor.top_p=0.9") == f"{ARR}.actor.top_p: unknown key; did you mean {ARR}.rollout.top_p?"


def test_unknown_section_and_unrelated_key():
    assert only_problem("trainr.seed=3") == "trainr: unknown key; did you mean trainer?"
    assert only_problem("trainer.zzzz=3") == "trainer.zzzz: unknown key"


def test_section_given_a_scalar():
    assert only_problem(f"{ARR}.rollout.val_kwargs=3") == (
        f"{ARR}.rollout.val_kwargs: is a section; set its keys (e.g. {ARR}.rollout.val_kwargs.<key>=...), got 3"
    )


# --- types -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("override", "message"),
    [
        (f"{ARR}.rollout.n=abc", f"{ARR}.rollout.n: expected int, got str 'abc'"),
        (f"{ARR}.rollout.n=2.5", f"{ARR}.rollout.n: expected int, got float 2.5"),
        (f"{ARR}.rollout.n=true", f"{ARR}.rollout.n: expected int, got bool True"),
        (f"{ARR}.actor.use_kl_loss=yes please", f"{ARR}.actor.use_kl_loss: expected bool, got str 'yes please'"),
        (f"{ARR}.actor.optim.lr=[1]", f"{ARR}.actor.optim.lr: expected float, got list [1]"),
        ("trainer.experiment_name=false", "trainer.experiment_name: expected str, got bool False (quote it if you meant the text)"),
        ("trainer.seed=null", "trainer.seed: expected int, got null"),
        ("trainer.logger=[console,1.5,{a: 1}]", "trainer.logger: item [2]: expected str, got map {'a': 1}"),
        ("data.apply_chat_template_kwargs=3", "data.apply_chat_template_kwargs: expected map, got int 3"),
        ("data.truncation=sideways", "data.truncation: must be one of 'error', 'left', 'right', 'middle'; got str 'sideways'"),
        (
            "algorithm.rollout_correction.rollout_is=word",
            "algorithm.rollout_correction.rollout_is: must be one of 'token', 'sequence'; got str 'word'",
        ),
    ],
)
def test_wrong_types(override, message):
    assert only_problem(override) == message


# --- bounds ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("override", "message"),
    [
        (f"{ARR}.rollout.top_p=0", f"{ARR}.rollout.top_p: must be > 0, got 0.0"),
        (f"{ARR}.rollout.top_p=1.5", f"{ARR}.rollout.top_p: must be ≤ 1, got 1.5"),
        (f"{ARR}.rollout.temperature=-0.1", f"{ARR}.rollout.temperature: must be ≥ 0, got -0.1"),
        (f"{ARR}.rollout.val_kwargs.temperature=-1", f"{ARR}.rollout.val_kwargs.temperature: must be ≥ 0, got -1.0"),
        (f"{ARR}.actor.optim.lr=0", f"{ARR}.actor.optim.lr: must be > 0, got 0.0"),
        ("critic.optim.lr=-1e-5", "critic.optim.lr: must be > 0, got -1e-05"),
        (f"{ARR}.rollout.n=0", f"{ARR}.rollout.n: must be ≥ 1, got 0"),
        (f"{ARR}.rollout.top_k=-2", f"{ARR}.rollout.top_k: must be ≥ -1, got -2"),
        ("algorithm.gamma=1.5", "algorithm.gamma: must be ≤ 1, got 1.5"),
        ("trainer.max_actor_ckpt_to_keep=0", "trainer.max_actor_ckpt_to_keep: must be ≥ 1, got 0"),
    ],
)
def test_out_of_range(override, message):
    assert only_problem(override) == message


# --- names from the algorithm registries -------------------------------------------------------


def test_unknown_algorithm_names_list_the_valid_ones():
    message = only_problem("algorithm.adv_estimator=grpoo")
    assert message.startswith("algorithm.adv_estimator: unknown advantage estimator 'grpoo'; valid names: ")
    assert "gae, gdpo, gpg, grpo, " in message and "rloo" in message
    message = only_problem(f"{ARR}.actor.policy_loss.loss_mode=ppo")
    assert message.startswith(f"{ARR}.actor.policy_loss.loss_mode: unknown policy loss 'ppo'; valid names: ")
    assert "gspo" in message and "vanilla" in message
    message = only_problem(f"{ARR}.actor.loss_agg_mode=mean")
    assert message.startswith(f"{ARR}.actor.loss_agg_mode: unknown loss_agg_mode 'mean'; valid names: ")
    assert "seq-mean-token-sum-norm" in message and "token-mean" in message
    assert only_problem("critic.loss_agg_mode=sum").startswith("critic.loss_agg_mode: unknown loss_agg_mode 'sum'")


def test_kl_estimator_names_accept_the_straight_through_suffix():
    message = only_problem("algorithm.kl_penalty=k4")
    assert message.startswith("algorithm.kl_penalty: unknown KL estimator 'k4'; valid names: ")
    assert "low_var_kl" in message and "(each also with a '+' suffix)" in message
    assert only_problem(f"{ARR}.actor.kl_loss_type=full").startswith(f"{ARR}.actor.kl_loss_type: unknown KL estimator 'full'")
    cfg = load_config(None, [f"{ARR}.actor.kl_loss_type=k3+", "algorithm.kl_penalty=low_var_kl"])
    assert cfg.actor_rollout_ref.actor.kl_loss_type == "k3+"


# --- cross-key rules ---------------------------------------------------------------------------


def test_mini_batch_must_divide_train_batch():
    assert only_problem("data.train_batch_size=12", f"{ARR}.actor.ppo_mini_batch_size=8") == (
        f"{ARR}.actor.ppo_mini_batch_size=8 must divide data.train_batch_size=12"
    )


def test_micro_batch_must_divide_per_device_mini_batch():
    # 4 prompts × 4 responses ÷ 2 processes = 8 rows per device; 3 does not divide 8.
    assert only_problem("trainer.n_gpus_per_node=2", f"{ARR}.actor.ppo_micro_batch_size_per_gpu=3") == (
        f"{ARR}.actor.ppo_micro_batch_size_per_gpu=3 must divide the per-device mini-batch "
        "ppo_mini_batch_size × rollout.n ÷ (nnodes × n_gpus_per_node) = 4 × 4 ÷ 2 = 8"
    )
    # With token-budget batching the count-based micro-batch is not used.
    load_config(None, ["trainer.n_gpus_per_node=2", f"{ARR}.actor.ppo_micro_batch_size_per_gpu=3", f"{ARR}.actor.use_dynamic_bsz=true"])


def test_mini_batch_responses_must_split_over_processes():
    assert only_problem(
        "data.train_batch_size=3", f"{ARR}.actor.ppo_mini_batch_size=3", f"{ARR}.rollout.n=3",
        "trainer.n_gpus_per_node=2", f"{ARR}.actor.ppo_micro_batch_size_per_gpu=1",
    ) == (
        f"{ARR}.actor.ppo_mini_batch_size × rollout.n = 3 × 3 = 9 responses must split evenly "
        "over nnodes × n_gpus_per_node = 2 processes"
    )  # fmt: skip


def test_critic_batches_are_checked_only_when_the_critic_runs():
    bad_critic = ["critic.ppo_micro_batch_size_per_gpu=5"]
    load_config(None, bad_critic)  # grpo: no critic, so its batch sizes do not matter
    assert only_problem("algorithm.adv_estimator=gae", *bad_critic) == (
        "critic.ppo_micro_batch_size_per_gpu=5 must divide the per-device mini-batch "
        "ppo_mini_batch_size × rollout.n ÷ (nnodes × n_gpus_per_node) = 4 × 4 ÷ 1 = 16"
    )


def test_group_estimators_need_more_than_one_response_per_prompt():
    assert only_problem(f"{ARR}.rollout.n=1", f"{ARR}.actor.ppo_micro_batch_size_per_gpu=4") == (
        f"algorithm.adv_estimator=grpo compares responses to the same prompt, so {ARR}.rollout.n must be > 1 (got 1)"
    )
    load_config(None, [f"{ARR}.rollout.n=1", f"{ARR}.actor.ppo_micro_batch_size_per_gpu=4", "algorithm.adv_estimator=gae"])


def test_dual_clip_bound_must_exceed_one():
    assert only_problem(f"{ARR}.actor.clip_ratio_c=1.0") == (
        f"{ARR}.actor.clip_ratio_c must be > 1 (dual-clip lower bound), got 1.0"
    )


def test_dro_needs_a_positive_beta():
    assert only_problem(f"{ARR}.actor.policy_loss.loss_mode=dro") == (
        f"{ARR}.actor.policy_loss.dro_beta must be > 0 for loss_mode=dro, got 0.0"
    )
    load_config(None, [f"{ARR}.actor.policy_loss.loss_mode=dro", f"{ARR}.actor.policy_loss.dro_beta=0.1"])


def test_rollout_correction_needs_rollout_log_probs_and_known_rejection_tests():
    needs = "compares the rollout's log-probs with the policy's: set actor_rollout_ref.rollout.calculate_log_probs=true"
    assert only_problem("algorithm.rollout_correction.bypass_mode=true") == (
        f"algorithm.rollout_correction.bypass_mode=true {needs}"
    )
    # the loss's own name switches bypass mode on too (hybridflow's earlier spelling)
    assert only_problem(f"{ARR}.actor.policy_loss.loss_mode=bypass_mode") == (
        f"algorithm.rollout_correction.bypass_mode=true {needs}"
    )
    assert only_problem("algorithm.rollout_correction.rollout_is=token") == f"algorithm.rollout_correction.rollout_is {needs}"
    message = only_problem("algorithm.rollout_correction.rollout_rs=token_k1,seq_k9", f"{ARR}.rollout.calculate_log_probs=true")
    assert message.startswith("algorithm.rollout_correction.rollout_rs: unknown test(s) 'seq_k9'; valid: ")
    assert only_problem("algorithm.rollout_correction.bypass_mode=true", f"{ARR}.rollout.calculate_log_probs=true",
                        f"{ARR}.actor.policy_loss.loss_mode=gspo").startswith(
        "algorithm.rollout_correction.bypass_mode=true trains with the bypass loss")
    cfg = load_config(
        None,
        [
            "algorithm.rollout_correction.bypass_mode=true",
            f"{ARR}.rollout.calculate_log_probs=true",
            "algorithm.rollout_correction.rollout_rs=token_k1,seq_max_k2",
            f"{ARR}.actor.policy_loss.rollout_correction.rollout_is_threshold=0.5_2.0",  # moved to algorithm
        ],
    )
    rc = cfg.algorithm.rollout_correction
    assert rc.rollout_is_threshold == "0.5_2.0" and rc.rollout_rs_threshold == "0.5_2.0"
    # the actor reads a resolved copy, and bypass mode selects the bypass loss (as in verl)
    assert cfg.actor_rollout_ref.actor.policy_loss.rollout_correction == rc
    assert cfg.actor_rollout_ref.actor.policy_loss.loss_mode == "bypass_mode"


def test_clip_cov_bounds_are_ordered():
    assert only_problem(f"{ARR}.actor.policy_loss.clip_cov_lb=6") == (
        f"{ARR}.actor.policy_loss.clip_cov_lb (6.0) must be below clip_cov_ub (5.0)"
    )


def test_sampling_needs_a_positive_temperature():
    assert only_problem(f"{ARR}.rollout.temperature=0") == (
        f"{ARR}.rollout.temperature must be > 0 when {ARR}.rollout.do_sample=true "
        "(for greedy decoding set do_sample=false)"
    )
    assert only_problem(f"{ARR}.rollout.val_kwargs.do_sample=true").startswith(
        f"{ARR}.rollout.val_kwargs.temperature must be > 0 when {ARR}.rollout.val_kwargs.do_sample=true"
    )


def test_optimizer_betas():
    assert only_problem(f"{ARR}.actor.optim.betas=[0.9]") == f"{ARR}.actor.optim.betas must be two numbers in [0, 1), got [0.9]"
    assert only_problem("critic.optim.betas=[0.9,1.0]") == "critic.optim.betas must be two numbers in [0, 1), got [0.9, 1.0]"


def test_data_rules():
    assert only_problem("data.max_samples=0") == "data.max_samples must be -1 (all rows) or ≥ 1, got 0"
    assert only_problem("data.train_files=[]") == "data.train_files must name at least one file"


def test_gdpo_weights_match_keys():
    assert only_problem("algorithm.gdpo_reward_keys=[acc,format]", "algorithm.gdpo_reward_weights=[1.0]") == (
        "algorithm.gdpo_reward_weights has 1 entries but algorithm.gdpo_reward_keys has 2; give one weight per key (or none)"
    )


def test_trainer_rules():
    assert only_problem("trainer.resume_mode=resume_path") == (
        "trainer.resume_from_path must be set when trainer.resume_mode=resume_path"
    )
    assert only_problem("trainer.nnodes=2") == "trainer.nnodes=2 needs trainer.backend=ray (local runs on one machine)"
    load_config(None, ["trainer.nnodes=2", "trainer.backend=ray"])
    assert only_problem("trainer.rollout_token_rows=4", "data.train_files=[mine.parquet]") == (
        "trainer.rollout_token_rows=4 needs trainer.rollout_data_dir (the per-token values go into its dump)"
    )
    load_config(None, ["trainer.rollout_token_rows=4", "trainer.rollout_data_dir=/tmp/dumps"])


def test_the_main_job_records_its_rollouts_in_its_run_folder_and_other_data_does_not():
    main = load_config(None, []).trainer
    assert main.default_local_dir == "checkpoints/hybridflow/default"
    assert main.rollout_data_dir == "checkpoints/hybridflow/default/rollouts"
    assert main.validation_data_dir == "checkpoints/hybridflow/default/validation"
    assert main.rollout_token_rows == 8
    moved = load_config(None, ["trainer.default_local_dir=/runs/a", "trainer.rollout_data_dir=/dumps"]).trainer
    assert (moved.rollout_data_dir, moved.validation_data_dir, moved.rollout_token_rows) == ("/dumps", "/runs/a/validation", 0)
    other = load_config(None, ["data.train_files=[mine.parquet]"]).trainer
    assert (other.rollout_data_dir, other.validation_data_dir, other.rollout_token_rows) == (None, None, 0)


def test_all_problems_of_a_phase_are_reported_together():
    found = problems(f"{ARR}.rollout.top_p=2", "trainer.seed=x", "data.nope=1")
    assert found == ["data.nope: unknown key"]  # unknown keys are reported before values are read
    found = problems(f"{ARR}.rollout.top_p=2", "trainer.seed=x")
    assert found == ["trainer.seed: expected int, got str 'x'"]  # types before bounds
    found = problems(f"{ARR}.rollout.top_p=2", "algorithm.adv_estimator=nope")
    assert len(found) == 2 and found[0].startswith(f"{ARR}.rollout.top_p") and "nope" in found[1]
    with pytest.raises(ConfigError) as info:
        load_config(None, [f"{ARR}.rollout.top_p=2", f"{ARR}.rollout.top_k=-5"])
    assert str(info.value).startswith("invalid config:\n  - ")


def test_finalize_checks_configs_built_in_code():
    cfg = finalize_ppo_config(PPOConfig())
    assert cfg == load_config()
    with pytest.raises(ConfigError, match=r"data\.train_batch_size: must be ≥ 1, got 0"):
        finalize_ppo_config(PPOConfig(data=DataConfig(train_batch_size=0)))
