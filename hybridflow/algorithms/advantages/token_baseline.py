"""Optimal Token Baseline (Li et al. 2026, arXiv 2602.07078) and its multi-turn variant.

Per prompt group and token position t, the baseline weights each trajectory's return by its
cumulative "path variance" proxy:

    G_t  = Σ_{t' ≥ t} r_t' m_t'                        (reward-to-go)
    w_t  = (1 − 2 π_t + Σ_v π_v²) · ρ̄_t²     (π_t = exp(old_log_prob_t); ρ̄ = IS weight or 1)
    W_t  = Σ_{j ≤ t} w_j m_j
    B_t  = Σ_i G_it W_it m_it / (Σ_i W_it m_it + ε)     (sum over the group's rows)
    A_t  = (G_t − B_t) · m_t

A group of one has B = 0 (A = G). With ``handle_zero_tail`` the baseline of the single longest
row of a group is zeroed past the second-longest row's length (nobody else reaches those
positions, so the "baseline" there would be the row's own return).
"""

from __future__ import annotations

import torch

from hybridflow.algorithms.advantages.grouping import GroupIndex, group_rows, index_keys
from hybridflow.algorithms.advantages.registry import AdvantageEstimator, EstimatorSpec, register_adv_est

OTB_SPEC = EstimatorSpec(
    needs_index=True,
    requires_groups=True,
    needs_old_log_probs=True,
    needs_sum_pi_squared=True,
    accepts_rollout_is_weights=True,
)


def _returns_and_path_weight(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    old_log_probs: torch.Tensor,
    sum_pi_squared: torch.Tensor,
    rollout_is_weights: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(G, W): reward-to-go and cumulative path-variance proxy, both (B, T)."""
    returns = (token_level_rewards * response_mask).flip(dims=[-1]).cumsum(dim=-1).flip(dims=[-1])
    w = 1 - 2 * torch.exp(old_log_probs) + sum_pi_squared
    if rollout_is_weights is not None:
        w = w * rollout_is_weights**2
    return returns, (w * response_mask).cumsum(dim=-1)


def _zero_tail_start(lengths: list[int]) -> tuple[int, int] | None:
    """(position in group, second-longest length) of a unique longest row, else None."""
    ordered = sorted(lengths)
    longest, second = ordered[-1], ordered[-2]
    if longest > second and lengths.count(longest) == 1:
        return lengths.index(longest), second
    return None


@register_adv_est(AdvantageEstimator.OPTIMAL_TOKEN_BASELINE, OTB_SPEC)
@torch.no_grad()
def compute_optimal_token_baseline_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: GroupIndex,
    old_log_probs: torch.Tensor,
    sum_pi_squared: torch.Tensor,
    rollout_is_weights: torch.Tensor | None = None,
    handle_zero_tail: bool = True,
    epsilon: float = 1e-8,
) -> tuple[torch.Tensor, torch.Tensor]:
    """OTB with the baseline taken per padded position t (formulas: module docstring).

    All tensors (B, T); ``index`` (B,). Returns (advantages, returns = G).
    """
    returns, path_weight = _returns_and_path_weight(
        token_level_rewards, response_mask, old_log_probs, sum_pi_squared, rollout_is_weights
    )
    baselines = torch.zeros_like(returns)
    for rows in group_rows(index, returns.shape[0]):
        if len(rows) == 1:
            continue
        mask = response_mask[rows]
        weight = path_weight[rows] * mask
        baseline = (returns[rows] * weight).sum(dim=0) / (weight.sum(dim=0) + epsilon)
        baselines[rows] = baseline.unsqueeze(0).expand(len(rows), -1).to(baselines.dtype)
        if handle_zero_tail:
            tail = _zero_tail_start([int(n) for n in mask.sum(dim=-1).tolist()])
            if tail is not None:
                baselines[rows[tail[0]], tail[1] :] = 0.0
    advantages = (returns - baselines) * response_mask
    return advantages, returns


def _compact(values: torch.Tensor, response_mask: torch.Tensor, width: int) -> torch.Tensor:
    """Move each row's mask-1 entries to the front: (B, T) → (B, width), zero padded."""
    out = values.new_zeros((values.shape[0], width))
    for i in range(values.shape[0]):
        kept = values[i, response_mask[i].bool()]
        out[i, : kept.shape[0]] = kept
    return out


@register_adv_est(AdvantageEstimator.TIR_OPTIMAL_TOKEN_BASELINE, OTB_SPEC)
@torch.no_grad()
def compute_multi_turn_optimal_token_baseline_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: GroupIndex,
    old_log_probs: torch.Tensor,
    sum_pi_squared: torch.Tensor,
    rollout_is_weights: torch.Tensor | None = None,
    handle_zero_tail: bool = True,
    epsilon: float = 1e-8,
) -> tuple[torch.Tensor, torch.Tensor]:
    """OTB for tool-integrated (multi-turn) responses, whose masks have holes (tool output).

    G and W are computed on the padded layout, then each row's mask-1 tokens are compacted to
    the front so that "position t" means "the row's t-th generated token"; B_t is taken per
    compacted position, A = G − B is scattered back to the original positions, × m. Rows with
    no valid token are ignored. Returns (advantages, returns = G), (B, T).
    """
    returns, path_weight = _returns_and_path_weight(
        token_level_rewards, response_mask, old_log_probs, sum_pi_squared, rollout_is_weights
    )
    lengths = [int(n) for n in response_mask.sum(dim=-1).tolist()]
    width = max(lengths, default=0)
    compact_returns = _compact(returns, response_mask, width)
    compact_weight = _compact(path_weight, response_mask, width)
    baselines = torch.zeros_like(compact_returns)
    non_empty = [key if n > 0 else None for key, n in zip(index_keys(index), lengths, strict=True)]
    for rows in group_rows(non_empty, len(non_empty)):
        if non_empty[rows[0]] is None or len(rows) == 1:
            continue
        weight = compact_weight[rows]
        baseline = (compact_returns[rows] * weight).sum(dim=0) / (weight.sum(dim=0) + epsilon)
        baselines[rows] = baseline.to(baselines.dtype)
        if handle_zero_tail:
            tail = _zero_tail_start([lengths[r] for r in rows])
            if tail is not None:
                baselines[rows[tail[0]], tail[1] :] = 0.0
    compact_advantages = compact_returns - baselines
    advantages = torch.zeros_like(returns)
    for i, n in enumerate(lengths):
        if n > 0:
            advantages[i, response_mask[i].bool()] = compact_advantages[i, :n]
    return advantages * response_mask, returns
