"""Outcome-reward estimators: one scalar score per response, compared within its prompt group.

Notation: row i, token t, m = response_mask (B, T), s_i = Σ_t r_it (the row's score), g(i) the
group of row i (rows with the same ``index``), n_g its size. Every estimator returns
``(advantages, returns)`` of shape (B, T) with advantages = scalar_i · m_it, computed without
gradient, and (for these outcome estimators) returns = advantages.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from hybridflow.algorithms.advantages.grouping import GroupIndex, group_ids, group_rows, group_sizes
from hybridflow.algorithms.advantages.registry import (
    GROUP_SPEC,
    AdvantageEstimator,
    EstimatorSpec,
    register_adv_est,
)
from hybridflow.algorithms.utils import masked_whiten


def group_mean_std(scores: torch.Tensor, index: GroupIndex) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row group mean μ_g(i) and unbiased std σ_g(i), (B,) each, one group at a time.

    A group of one has μ = 0, σ = 1 (its advantage is its own score). Uses ``torch.mean`` and
    ``torch.std`` on each group's scores in row order, exactly as verl's loop does.
    """
    mean = torch.zeros_like(scores)
    std = torch.ones_like(scores)
    for rows in group_rows(index, scores.shape[0]):
        if len(rows) > 1:
            group = scores[rows]
            mean[rows] = group.mean()
            std[rows] = group.std()
    return mean, std


def grpo_scalar(scores: torch.Tensor, index: GroupIndex, epsilon: float, norm_adv_by_std_in_grpo: bool) -> torch.Tensor:
    """(s_i − μ_g)/(σ_g + ε), or s_i − μ_g without std normalisation; (B,)."""
    mean, std = group_mean_std(scores, index)
    if norm_adv_by_std_in_grpo:
        return (scores - mean) / (std + epsilon)
    return scores - mean


@register_adv_est(
    AdvantageEstimator.GRPO,
    EstimatorSpec(needs_index=True, requires_groups=True, params=("norm_adv_by_std_in_grpo",)),
)
@torch.no_grad()
def compute_grpo_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: GroupIndex,
    epsilon: float = 1e-6,
    norm_adv_by_std_in_grpo: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GRPO (Shao et al. 2024, arXiv 2402.03300); Dr.GRPO without std (arXiv 2503.20783).

    A_it = (s_i − μ_g)/(σ_g + ε) · m_it, σ_g the unbiased group std; with
    ``norm_adv_by_std_in_grpo=False`` A_it = (s_i − μ_g) · m_it. A group of one: μ = 0, σ = 1.
    Shapes: rewards/mask (B, T), index (B,). Returns (A, A).
    """
    scores = token_level_rewards.sum(dim=-1)
    advantages = grpo_scalar(scores, index, epsilon, norm_adv_by_std_in_grpo).unsqueeze(-1) * response_mask
    return advantages, advantages


def _scatter_group_stats(scores: torch.Tensor, index: GroupIndex) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-row μ_g, σ_g = sqrt(max(var_g, 0)) and n_g computed with scatter ops (no Python loop)."""
    gidx, num_groups = group_ids(index, scores.shape[0], scores.device)
    count = torch.zeros(num_groups, dtype=scores.dtype, device=scores.device).index_add_(
        0, gidx, torch.ones_like(scores)
    )
    total = torch.zeros_like(count).index_add_(0, gidx, scores)
    mean = total / count
    # Two-pass variance: Σ (s − μ)² avoids the cancellation of Σ s² − (Σ s)²/n.
    sq_dev = torch.zeros_like(count).index_add_(0, gidx, (scores - mean[gidx]) ** 2)
    var = sq_dev / (count - 1).clamp(min=1)
    std = torch.sqrt(var.clamp(min=0.0))
    single = count <= 1
    mean = torch.where(single, torch.zeros_like(mean), mean)
    std = torch.where(single, torch.ones_like(std), std)
    return mean[gidx], std[gidx], count[gidx]


@register_adv_est(
    AdvantageEstimator.GRPO_VECTORIZED,
    EstimatorSpec(needs_index=True, requires_groups=True, params=("norm_adv_by_std_in_grpo",)),
)
@torch.no_grad()
def compute_grpo_vectorized_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: GroupIndex,
    epsilon: float = 1e-6,
    norm_adv_by_std_in_grpo: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GRPO with scatter ops instead of a loop over groups; same result as ``grpo``.

    σ_g = sqrt(max(var_g, 0)) with the unbiased var; groups of one μ = 0, σ = 1. Returns (A, A).
    """
    scores = token_level_rewards.sum(dim=-1)
    mean, std, _ = _scatter_group_stats(scores, index)
    scalars = (scores - mean) / (std + epsilon) if norm_adv_by_std_in_grpo else scores - mean
    advantages = scalars.unsqueeze(-1) * response_mask
    return advantages, advantages


@register_adv_est(
    AdvantageEstimator.GDPO,
    EstimatorSpec(
        needs_index=True,
        requires_groups=True,
        needs_multi_reward=True,
        params=("norm_adv_by_std_in_grpo", "gdpo_reward_weights"),
    ),
)
@torch.no_grad()
def compute_gdpo_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: GroupIndex,
    reward_components: torch.Tensor | None = None,
    gdpo_reward_weights: Sequence[float] | None = None,
    epsilon: float = 1e-6,
    norm_adv_by_std_in_grpo: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GDPO, group reward-decoupled normalisation (arXiv 2601.05242).

    Each reward component k (column of ``reward_components``, (B, K)) is normalised per group as
    in GRPO: A_k = (c_ik − μ_g,k)/(σ_g,k + ε); A = Σ_k w_k · A_k · m; then
    advantages = masked_whiten(A, m) · m over the batch. Without components the row score s_i is
    the single component. ``gdpo_reward_weights`` (K,) defaults to all ones. Returns (A, A).
    """
    if reward_components is None:
        components = token_level_rewards.sum(dim=-1, keepdim=True)
    else:
        components = reward_components.to(token_level_rewards.dtype)
        if components.dim() != 2 or components.shape[0] != token_level_rewards.shape[0]:
            raise ValueError(
                f"gdpo: reward_components must be (B, K) with B={token_level_rewards.shape[0]}, "
                f"got {tuple(components.shape)}"
            )
    num_components = components.shape[1]
    weights = list(gdpo_reward_weights) if gdpo_reward_weights else [1.0] * num_components  # empty = all ones
    if len(weights) != num_components:
        raise ValueError(
            f"gdpo: algorithm.gdpo_reward_weights has {len(weights)} entries for {num_components} reward components"
        )
    combined = torch.zeros_like(token_level_rewards)
    for k, weight in enumerate(weights):
        scalar = grpo_scalar(components[:, k], index, epsilon, norm_adv_by_std_in_grpo)
        combined = combined + weight * (scalar.unsqueeze(-1) * response_mask)
    advantages = masked_whiten(combined, response_mask) * response_mask
    return advantages, advantages


@register_adv_est(
    AdvantageEstimator.GRPO_PASSK,
    EstimatorSpec(needs_index=True, requires_groups=True, params=("norm_adv_by_std_in_grpo",)),
)
@torch.no_grad()
def compute_grpo_passk_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: GroupIndex,
    epsilon: float = 1e-6,
    norm_adv_by_std_in_grpo: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pass@k GRPO (Chen et al. 2025, arXiv 2503.19595).

    In each group (size ≥ 2, else ValueError) only the best row gets A = s_max − s_second
    (÷ (σ_g + ε) when normalising, σ_g the unbiased std); all others 0. × m. Returns (A, A).
    """
    scores = token_level_rewards.sum(dim=-1)
    scalars = torch.zeros_like(scores)
    for rows in group_rows(index, scores.shape[0]):
        if len(rows) < 2:
            raise ValueError(f"grpo_passk needs at least 2 samples per group; a group has {len(rows)} (rows {rows})")
        group = scores[rows]
        top, top_idx = torch.topk(group, 2)
        advantage = top[0] - top[1]
        if norm_adv_by_std_in_grpo:
            advantage = advantage / (group.std() + epsilon)
        scalars[rows[int(top_idx[0])]] = advantage
    advantages = scalars.unsqueeze(-1) * response_mask
    return advantages, advantages


@register_adv_est(AdvantageEstimator.REINFORCE_PLUS_PLUS_BASELINE, GROUP_SPEC)
@torch.no_grad()
def compute_reinforce_plus_plus_baseline_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: GroupIndex,
) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++ with a group-mean baseline (Hu 2025, arXiv 2501.03262).

    A_it = (s_i − μ_g) · m_it (group of one: μ = 0), then masked_whiten over the whole batch, × m.
    Returns (A, A).
    """
    scores = token_level_rewards.sum(dim=-1)
    mean, _ = group_mean_std(scores, index)
    centred = (scores - mean).unsqueeze(-1).expand_as(token_level_rewards) * response_mask
    advantages = masked_whiten(centred, response_mask) * response_mask
    return advantages, advantages


@register_adv_est(AdvantageEstimator.RLOO, GROUP_SPEC)
@torch.no_grad()
def compute_rloo_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: GroupIndex,
) -> tuple[torch.Tensor, torch.Tensor]:
    """RLOO, leave-one-out baseline (Ahmadian et al. 2024, arXiv 2402.14740).

    Groups with n > 1: A_i = n/(n−1) · (s_i − μ_g) = s_i − mean of the other n − 1 scores.
    A group of one keeps A_i = s_i. × m. Returns (A, A).
    """
    scores = token_level_rewards.sum(dim=-1)
    scalars = scores.clone()
    for rows in group_rows(index, scores.shape[0]):
        n = len(rows)
        if n > 1:
            group = scores[rows]
            scalars[rows] = group * n / (n - 1) - group.mean() * n / (n - 1)
    advantages = scalars.unsqueeze(-1) * response_mask
    return advantages, advantages


@register_adv_est(AdvantageEstimator.RLOO_VECTORIZED, GROUP_SPEC)
@torch.no_grad()
def compute_rloo_vectorized_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: GroupIndex,
) -> tuple[torch.Tensor, torch.Tensor]:
    """RLOO with scatter ops: A_i = (n·s_i − Σ_g s)/(n − 1) for n > 1; **0** for a group of one.

    Equals ``rloo`` on every group with n > 1 (verl's vectorised version also zeroes singletons).
    """
    scores = token_level_rewards.sum(dim=-1)
    gidx, num_groups = group_ids(index, scores.shape[0], scores.device)
    count = group_sizes(gidx, num_groups, scores.dtype)
    totals = torch.zeros(num_groups, dtype=scores.dtype, device=scores.device).index_add_(0, gidx, scores)[gidx]
    scalars = (count * scores - totals) / (count - 1).clamp(min=1) * (count > 1)
    advantages = scalars.unsqueeze(-1) * response_mask
    return advantages, advantages


@register_adv_est(AdvantageEstimator.OPO, GROUP_SPEC)
@torch.no_grad()
def compute_opo_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: GroupIndex,
) -> tuple[torch.Tensor, torch.Tensor]:
    """OPO, length-weighted optimal baseline (Hao et al. 2025, arXiv 2505.23585).

    b_g = Σ_j |y_j| s_j / Σ_j |y_j| over the group (|y| = Σ_t m; group of one: b = 0);
    A_i = (s_i − b_g) · m. Returns (A, A).
    """
    scores = token_level_rewards.sum(dim=-1)
    lengths = response_mask.sum(dim=-1).to(scores.dtype)
    baseline = torch.zeros_like(scores)
    for rows in group_rows(index, scores.shape[0]):
        if len(rows) > 1:
            group_len = lengths[rows]
            # clamp only matters for an all-empty group, whose mask zeroes the result anyway
            baseline[rows] = (group_len * scores[rows]).sum() / group_len.sum().clamp(min=1)
    advantages = (scores - baseline).unsqueeze(-1) * response_mask
    return advantages, advantages


@register_adv_est(AdvantageEstimator.GPG, GROUP_SPEC)
@torch.no_grad()
def compute_gpg_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: GroupIndex,
    f_norm: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GPG, group policy gradient (Chu et al. 2025, arXiv 2504.02546).

    α = B / max(#{i : s_i ≠ 0}, 1) over the batch; A_i = α (s_i − μ_g) / f_norm (group of one:
    μ = 0); × m. Returns (A, A).
    """
    scores = token_level_rewards.sum(dim=-1)
    alpha = scores.shape[0] / torch.count_nonzero(scores).clamp(min=1)
    mean, _ = group_mean_std(scores, index)
    advantages = (alpha * (scores - mean) / f_norm).unsqueeze(-1) * response_mask
    return advantages, advantages
