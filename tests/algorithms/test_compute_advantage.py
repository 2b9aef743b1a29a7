"""The spec-driven entry point, registry rules, edge cases shared by every estimator, and PF-PPO."""

import numpy as np
import pytest
import torch

from hybridflow.algorithms.advantages import (
    ADV_ESTIMATORS,
    AdvantageEstimator,
    EstimatorSpec,
    compute_advantage,
    compute_grpo_outcome_advantage,
    compute_pf_ppo_reweight_indices,
    get_adv_estimator_fn,
    get_estimator_spec,
    pf_ppo_weights,
    register_adv_est,
)

ALL = ADV_ESTIMATORS.names()
BUILTIN = [e.value for e in AdvantageEstimator]


def _inputs(seed=0, rows=8, width=5, lengths=None, scores=None, index=None):
    g = torch.Generator().manual_seed(seed)
    if lengths is None:
        lengths = torch.randint(1, width + 1, (rows,), generator=g).tolist()
    mask = (torch.arange(width) < torch.tensor(lengths).unsqueeze(-1)).float()
    if scores is None:
        scores = torch.randint(0, 3, (rows,), generator=g).float().tolist()
    rewards = torch.zeros(rows, width)
    for i, (n, s) in enumerate(zip(lengths, scores)):
        rewards[i, max(n - 1, 0)] = s
    return {
        "token_level_rewards": rewards,
        "response_mask": mask,
        "index": np.array(index if index is not None else [f"p{i // 4}" for i in range(rows)], dtype=object),
        "values": torch.randn(rows, width, generator=g),
        "reward_baselines": torch.rand(rows, generator=g),
        "old_log_probs": -torch.rand(rows, width, generator=g) * 2,
        "ref_log_prob": -torch.rand(rows, width, generator=g) * 2,
        "sum_pi_squared": torch.rand(rows, width, generator=g) * 0.5,
    }


PARAMS = {"gamma": 0.99, "lam": 0.95, "norm_adv_by_std_in_grpo": True}


def test_every_builtin_is_registered_with_a_spec():
    assert set(BUILTIN) <= set(ALL)
    for name in BUILTIN:
        assert isinstance(get_estimator_spec(name), EstimatorSpec)
    assert get_estimator_spec("gae").needs_values
    assert get_estimator_spec("remax").needs_reward_baselines
    assert get_estimator_spec("grpo").requires_groups and not get_estimator_spec("gae").requires_groups
    otb = get_estimator_spec("optimal_token_baseline")
    assert otb.needs_old_log_probs and otb.needs_sum_pi_squared and otb.accepts_rollout_is_weights
    assert get_estimator_spec("gdpo").needs_multi_reward
    assert get_estimator_spec(AdvantageEstimator.GAE).params == ("gamma", "lam")


def test_registry_rules():
    assert get_adv_estimator_fn(AdvantageEstimator.GRPO) is compute_grpo_outcome_advantage
    register_adv_est("grpo", get_estimator_spec("grpo"))(compute_grpo_outcome_advantage)  # same fn: no-op

    def other(token_level_rewards, response_mask):
        return token_level_rewards, token_level_rewards

    with pytest.raises(ValueError, match="already registered"):
        register_adv_est("grpo")(other)
    assert get_adv_estimator_fn("grpo") is compute_grpo_outcome_advantage
    with pytest.raises(ValueError, match="valid names: .*gae.*grpo"):
        get_adv_estimator_fn("GRPO")  # case-sensitive
    with pytest.raises(ValueError, match="rloo"):
        compute_advantage("nope", token_level_rewards=torch.zeros(1, 1), response_mask=torch.ones(1, 1))


def test_custom_estimator_runs_through_the_same_path():
    @register_adv_est("test_only_discounted_score", EstimatorSpec(needs_index=True, params=("gamma",)))
    def discounted(token_level_rewards, response_mask, index, gamma=1.0):
        adv = token_level_rewards.sum(-1, keepdim=True) * gamma * response_mask
        return adv, adv

    inputs = _inputs()
    adv, _ = compute_advantage("test_only_discounted_score", **inputs, params={"gamma": 0.5, "lam": 0.1})
    assert torch.allclose(adv, inputs["token_level_rewards"].sum(-1, keepdim=True) * 0.5 * inputs["response_mask"])


def test_params_are_routed_by_spec():
    inputs = _inputs()
    a, _ = compute_advantage("gae", **inputs, params={"gamma": 0.5, "lam": 0.5})
    b, _ = compute_advantage("gae", **inputs, params={"gamma": 1.0, "lam": 1.0})
    assert not torch.allclose(a, b)
    dr, _ = compute_advantage("grpo", **inputs, params={"norm_adv_by_std_in_grpo": False, "gamma": 0.5})
    direct, _ = compute_grpo_outcome_advantage(
        inputs["token_level_rewards"], inputs["response_mask"], inputs["index"], norm_adv_by_std_in_grpo=False
    )
    assert torch.equal(dr, direct)


@pytest.mark.parametrize(
    ("name", "missing", "message"),
    [
        ("gae", "values", "values="),
        ("grpo", "index", "index="),
        ("remax", "reward_baselines", "reward_baselines="),
        ("optimal_token_baseline", "sum_pi_squared", "sum_pi_squared="),
    ],
)
def test_missing_declared_input_is_named(name, missing, message):
    inputs = _inputs()
    inputs[missing] = None
    with pytest.raises(ValueError, match=message):
        compute_advantage(name, **inputs, params=PARAMS)


@pytest.mark.parametrize("name", ["grpo", "gae", "reinforce_plus_plus"])
def test_nan_rewards_raise(name):
    inputs = _inputs()
    inputs["token_level_rewards"][0, 0] = float("nan")
    with pytest.raises(ValueError, match="token_level_rewards contains NaN/inf"):
        compute_advantage(name, **inputs, params=PARAMS)


def test_nan_values_raise_only_at_valid_positions():
    inputs = _inputs(lengths=[2] * 8)
    inputs["values"][0, 4] = float("inf")  # masked out: fine
    compute_advantage("gae", **inputs, params=PARAMS)
    inputs["values"][0, 0] = float("nan")
    with pytest.raises(ValueError, match="values contains NaN/inf"):
        compute_advantage("gae", **inputs, params=PARAMS)


def test_rollout_is_weights_reach_only_estimators_that_accept_them():
    inputs = _inputs()
    weights = torch.full_like(inputs["response_mask"], 3.0)
    weights[0] = 0.1
    plain, _ = compute_advantage("optimal_token_baseline", **inputs)
    weighted, _ = compute_advantage("optimal_token_baseline", **inputs, rollout_is_weights=weights)
    assert not torch.allclose(plain, weighted)
    g1, _ = compute_advantage("grpo", **inputs)
    g2, _ = compute_advantage("grpo", **inputs, rollout_is_weights=weights)
    assert torch.equal(g1, g2)


def test_reward_components_reach_gdpo():
    inputs = _inputs()
    components = torch.rand(8, 2, generator=torch.Generator().manual_seed(5))
    a, _ = compute_advantage("gdpo", **inputs, reward_components=components)
    b, _ = compute_advantage("gdpo", **inputs)
    assert not torch.allclose(a, b)


# --- properties and edge cases shared by every estimator ------------------------------------

RUNNABLE = [n for n in BUILTIN if n != "grpo_passk"]  # pass@k needs groups of >= 2, tested below


@pytest.mark.parametrize("name", BUILTIN)
@pytest.mark.parametrize("seed", range(2))
def test_advantages_are_zero_where_mask_is_zero(name, seed):
    inputs = _inputs(seed=seed)
    inputs["response_mask"][::3, 0] = 0.0  # holes as well as padding
    adv, ret = compute_advantage(name, **inputs, params=PARAMS)
    assert adv.shape == ret.shape == inputs["response_mask"].shape
    assert (adv[inputs["response_mask"] == 0] == 0).all()
    assert not adv.requires_grad


@pytest.mark.parametrize("name", BUILTIN)
def test_all_empty_responses_give_zero_advantages(name):
    inputs = _inputs()
    inputs["response_mask"] = torch.zeros_like(inputs["response_mask"])
    inputs["token_level_rewards"] = torch.zeros_like(inputs["token_level_rewards"])
    adv, _ = compute_advantage(name, **inputs, params=PARAMS)
    assert torch.equal(adv, torch.zeros_like(adv))


@pytest.mark.parametrize("name", RUNNABLE)
def test_groups_of_one_are_finite(name):
    inputs = _inputs(index=[f"solo{i}" for i in range(8)])
    adv, _ = compute_advantage(name, **inputs, params=PARAMS)
    assert torch.isfinite(adv).all()


@pytest.mark.parametrize(
    "name",
    ["grpo", "grpo_vectorized", "gdpo", "grpo_passk", "rloo", "rloo_vectorized", "opo", "gpg",
     "reinforce_plus_plus_baseline"],
)  # fmt: skip
def test_all_equal_scores_in_every_group_give_zero(name):
    inputs = _inputs(scores=[1.0] * 4 + [0.5] * 4)
    adv, _ = compute_advantage(name, **inputs, params=PARAMS)
    assert torch.allclose(adv, torch.zeros_like(adv), atol=1e-6)


def test_grpo_passk_rejects_groups_of_one_through_entry_point():
    with pytest.raises(ValueError, match="at least 2"):
        compute_advantage("grpo_passk", **_inputs(index=[f"solo{i}" for i in range(8)]))


# --- PF-PPO ---------------------------------------------------------------------------------


def test_pf_ppo_weights_by_hand():
    scores = torch.tensor([1.0, -2.0, 0.0, -2.0])
    assert pf_ppo_weights(scores, "pow", 2.0).tolist() == [1.0, 4.0, 0.0, 4.0]
    assert pf_ppo_weights(scores, "max_min").tolist() == [1.0, 1.0, 0.0, 1.0]
    assert pf_ppo_weights(scores, "max_random").tolist() == pytest.approx([0.4, 0.1, 0.1, 0.1])
    with pytest.raises(ValueError, match="max_min"):
        pf_ppo_weights(scores, "softmax")


def test_pf_ppo_resampling_is_reproducible_and_skips_zero_weight_rows():
    scores = torch.zeros(200, 3)
    scores[:100, -1] = 1.0  # rows 100..199 have weight ~1e-8 under "pow"
    first = compute_pf_ppo_reweight_indices(scores, "pow", 2.0, generator=torch.Generator().manual_seed(7))
    again = compute_pf_ppo_reweight_indices(scores, "pow", 2.0, generator=torch.Generator().manual_seed(7))
    assert torch.equal(first, again)
    assert first.shape == (200,) and int(first.max()) < 100
