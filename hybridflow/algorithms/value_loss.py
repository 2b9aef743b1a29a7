"""Clipped value-function loss of PPO (Schulman et al. 2017, arXiv 1707.06347)."""

from __future__ import annotations

import torch

from hybridflow.algorithms.aggregation import GlobalBatchInfo, agg_loss_with_info
from hybridflow.algorithms.utils import masked_mean


def compute_value_loss(
    vpreds: torch.Tensor,
    returns: torch.Tensor,
    values: torch.Tensor,
    response_mask: torch.Tensor,
    cliprange_value: float,
    loss_agg_mode: str = "token-mean",
    *,
    global_batch_info: GlobalBatchInfo | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Clipped value loss; all inputs (B, T).

    v_c = clip(v̂, V − ε_v, V + ε_v);  loss = ½ · agg(max((v̂ − R)², (v_c − R)²));
    clipfrac = masked_mean[(v_c − R)² > (v̂ − R)²].
    ``vpreds`` v̂ = current critic, ``values`` V = critic at rollout time, ``returns`` R = targets,
    ε_v = ``critic.cliprange_value``. ``global_batch_info``: see :mod:`aggregation` for
    micro-batch / data-parallel use. Returns (loss scalar, clipfrac detached scalar).
    """
    if cliprange_value < 0:
        raise ValueError(f"critic.cliprange_value must be >= 0, got {cliprange_value}")
    vpred_clipped = torch.clamp(vpreds, values - cliprange_value, values + cliprange_value)
    loss_unclipped = (vpreds - returns) ** 2
    loss_clipped = (vpred_clipped - returns) ** 2
    loss_mat = torch.maximum(loss_unclipped, loss_clipped)
    vf_loss = 0.5 * agg_loss_with_info(loss_mat, response_mask, loss_agg_mode, global_batch_info)
    vf_clipfrac = masked_mean(torch.gt(loss_clipped, loss_unclipped).float(), response_mask)
    return vf_loss, vf_clipfrac.detach()
