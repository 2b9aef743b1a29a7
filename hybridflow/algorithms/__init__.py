"""Algorithm core: pure tensor functions with verl's names and math (torch only).

Modules (each registers its built-ins when imported):

* :mod:`.advantages`          ``ADV_ESTIMATORS``, ``compute_advantage``, every estimator, PF-PPO
* :mod:`.policy_losses`       ``POLICY_LOSSES``, every policy loss
* :mod:`.aggregation`         ``agg_loss``, ``LOSS_AGG_MODES``, ``GlobalBatchInfo``
* :mod:`.kl`                  ``KL_ESTIMATORS``, ``kl_penalty``, KL controllers, ``apply_kl_penalty``
* :mod:`.value_loss`          ``compute_value_loss``
* :mod:`.rollout_correction`  importance weights / rejection for rollout-training mismatch
* :mod:`.utils`               masked statistics, log-probs, entropy, response masks

Nothing here imports from the rest of the project except ``hybridflow.utils``.
"""
