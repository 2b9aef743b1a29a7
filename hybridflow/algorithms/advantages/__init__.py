"""Advantage estimators (``algorithm.adv_estimator``), their registry, and one entry point.

Importing this package registers every built-in estimator. Add your own with::

    @register_adv_est("my_est", EstimatorSpec(needs_index=True, params=("gamma",)))
    def my_est(token_level_rewards, response_mask, index, gamma=1.0):
        ...
        return advantages, returns
"""

from hybridflow.algorithms.advantages import outcome, temporal, token_baseline  # noqa: F401  (registers)
from hybridflow.algorithms.advantages.compute import compute_advantage
from hybridflow.algorithms.advantages.grouping import group_ids, group_rows
from hybridflow.algorithms.advantages.outcome import (
    compute_gdpo_outcome_advantage,
    compute_gpg_outcome_advantage,
    compute_grpo_outcome_advantage,
    compute_grpo_passk_outcome_advantage,
    compute_grpo_vectorized_outcome_advantage,
    compute_opo_outcome_advantage,
    compute_reinforce_plus_plus_baseline_outcome_advantage,
    compute_rloo_outcome_advantage,
    compute_rloo_vectorized_outcome_advantage,
)
from hybridflow.algorithms.advantages.pf_ppo import (
    PF_PPO_REWEIGHT_METHODS,
    compute_pf_ppo_reweight_indices,
    pf_ppo_weights,
)
from hybridflow.algorithms.advantages.registry import (
    ADV_ESTIMATORS,
    AdvantageEstimator,
    EstimatorSpec,
    get_adv_estimator_fn,
    get_estimator_spec,
    register_adv_est,
)
from hybridflow.algorithms.advantages.temporal import (
    compute_gae_advantage_return,
    compute_reinforce_plus_plus_outcome_advantage,
    compute_remax_outcome_advantage,
)
from hybridflow.algorithms.advantages.token_baseline import (
    compute_multi_turn_optimal_token_baseline_advantage,
    compute_optimal_token_baseline_advantage,
)

__all__ = [
    "ADV_ESTIMATORS",
    "PF_PPO_REWEIGHT_METHODS",
    "AdvantageEstimator",
    "EstimatorSpec",
    "compute_advantage",
    "compute_gae_advantage_return",
    "compute_gdpo_outcome_advantage",
    "compute_gpg_outcome_advantage",
    "compute_grpo_outcome_advantage",
    "compute_grpo_passk_outcome_advantage",
    "compute_grpo_vectorized_outcome_advantage",
    "compute_multi_turn_optimal_token_baseline_advantage",
    "compute_opo_outcome_advantage",
    "compute_optimal_token_baseline_advantage",
    "compute_pf_ppo_reweight_indices",
    "compute_reinforce_plus_plus_baseline_outcome_advantage",
    "compute_reinforce_plus_plus_outcome_advantage",
    "compute_remax_outcome_advantage",
    "compute_rloo_outcome_advantage",
    "compute_rloo_vectorized_outcome_advantage",
    "get_adv_estimator_fn",
    "get_estimator_spec",
    "group_ids",
    "group_rows",
    "pf_ppo_weights",
    "register_adv_est",
]
