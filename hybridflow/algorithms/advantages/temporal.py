"""Estimators built on per-token returns: GAE, REINFORCE++ and ReMax.

Notation: r = token_level_rewards (B, T), m = response_mask (B, T), γ = ``algorithm.gamma``,
λ = ``algorithm.lam``. All run without gradient and return ``(advantages, returns)``, (B, T).
Advantages are 0 wherever m = 0 (verl leaves whitened leftovers there for GAE and ReMax; the
loss never reads those positions, so the training signal is the same).
"""

from __future__ import annotations

import torch

from hybridflow.algorithms.advantages.registry import AdvantageEstimator, EstimatorSpec, register_adv_est
from hybridflow.algorithms.utils import masked_whiten


@register_adv_est(AdvantageEstimator.GAE, EstimatorSpec(needs_values=True, params=("gamma", "lam")))
@torch.no_grad()
def compute_gae_advantage_return(
    token_level_rewards: torch.Tensor,
    values: torch.Tensor,
    response_mask: torch.Tensor,
    gamma: float = 1.0,
    lam: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised Advantage Estimation (Schulman et al. 2015, arXiv 1506.02438).

    Backward over t with carried A_next = V_next = 0 at the end:
    δ_t = r_t + γ V_next − V_t;  Â_t = δ_t + γλ A_next;  only where m_t = 1 are V_next ← V_t and
    A_next ← Â_t updated, so masked positions (e.g. tool-output tokens inside a multi-turn
    response) are skipped and the values there do not matter.
    returns = Â + V;  advantages = masked_whiten(Â, m) · m. Shapes (B, T).
    """
    next_value = torch.zeros_like(values[:, 0])
    next_advantage = torch.zeros_like(values[:, 0])
    reversed_advantages = []
    for t in reversed(range(token_level_rewards.shape[-1])):
        valid = response_mask[:, t].bool()
        delta = token_level_rewards[:, t] + gamma * next_value - values[:, t]
        advantage_t = delta + gamma * lam * next_advantage
        # where(), not m·x + (1 − m)·y: a non-finite value at a skipped position must not leak
        next_value = torch.where(valid, values[:, t], next_value)
        next_advantage = torch.where(valid, advantage_t, next_advantage)
        reversed_advantages.append(next_advantage)
    advantages = torch.stack(reversed_advantages[::-1], dim=1)
    returns = advantages + values
    advantages = masked_whiten(advantages, response_mask) * response_mask
    return advantages, returns


@register_adv_est(AdvantageEstimator.REINFORCE_PLUS_PLUS, EstimatorSpec(params=("gamma",)))
@torch.no_grad()
def compute_reinforce_plus_plus_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    gamma: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++ (Hu 2025, arXiv 2501.03262).

    G_t = r_t + γ G_{t+1}, where the carried G_{t+1} is multiplied by m_{t+1} (a return never
    flows back across a masked position); advantages = masked_whiten(G, m) · m over the batch;
    returns = G. Shapes (B, T).
    """
    returns = torch.zeros_like(token_level_rewards)
    running = torch.zeros_like(token_level_rewards[:, 0])
    for t in reversed(range(token_level_rewards.shape[-1])):
        running = token_level_rewards[:, t] + gamma * running
        returns[:, t] = running
        running = running * response_mask[:, t]
    advantages = masked_whiten(returns, response_mask) * response_mask
    return advantages, returns


@register_adv_est(AdvantageEstimator.REMAX, EstimatorSpec(needs_reward_baselines=True))
@torch.no_grad()
def compute_remax_outcome_advantage(
    token_level_rewards: torch.Tensor,
    reward_baselines: torch.Tensor,
    response_mask: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """ReMax (Li et al. 2023, arXiv 2310.10505).

    G_t = Σ_{t' ≥ t} r_t' m_t';  A_t = (G_t − b_i) · m_t with b_i (B,) the score of the greedy
    response to the same prompt (``reward_baselines``). returns = G. Shapes (B, T).
    """
    returns = (token_level_rewards * response_mask).flip(dims=[-1]).cumsum(dim=-1).flip(dims=[-1])
    advantages = (returns - reward_baselines.unsqueeze(-1) * response_mask) * response_mask
    return advantages, returns
