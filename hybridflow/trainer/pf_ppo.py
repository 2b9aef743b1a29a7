"""Phase 6b (``algorithm.use_pf_ppo``): PF-PPO's resampling of the batch after advantages.

Policy Filtration for RLHF (Zhang et al. 2024, arXiv 2409.06957): rows are drawn with
replacement with probability ∝ a weight of their summed score
(:func:`hybridflow.algorithms.advantages.compute_pf_ppo_reweight_indices`), so the update
sees reliably scored rows more often. As in verl it follows GAE (a config rule enforces
that). The draw is seeded from ``trainer.seed`` and the step, so a resumed run draws the same rows.
"""

from __future__ import annotations

import numpy as np
import torch

from hybridflow import fields as F
from hybridflow.algorithms.advantages import compute_pf_ppo_reweight_indices
from hybridflow.config import PFPPOConfig
from hybridflow.protocol import DataProto


def pf_ppo_resample(batch: DataProto, cfg: PFPPOConfig, seed: int, step: int) -> DataProto:
    """The batch's rows resampled by PF-PPO weights (same size, rows repeat or drop out)."""
    state = np.random.SeedSequence([seed, step, 0x9F]).generate_state(1)[0]
    generator = torch.Generator().manual_seed(int(state))
    indices = compute_pf_ppo_reweight_indices(
        batch.require_batch()[F.TOKEN_LEVEL_SCORES], cfg.reweight_method, cfg.weight_pow, generator=generator
    )
    return batch.select_idxs(indices.numpy())
