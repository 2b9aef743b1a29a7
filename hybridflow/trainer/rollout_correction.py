"""Phase 3b of the PPO step: rollout correction (``algorithm.rollout_correction``, verl's keys).

The sampler's log-probs ℓ_rollout (``rollout_log_probs``, kept with
``rollout.calculate_log_probs``) differ from the trained policy's ℓ_old: another engine,
another precision (the built-in sampler decodes in bf16 on a CPU with native bf16), or stale
weights. Two ways to correct, chosen once by :func:`correction_mode`:

* **decoupled** (``rollout_is`` / ``rollout_rs`` set): after the old-log-prob phase,
  w = π_old/π_rollout (token or sequence level, truncated) goes into the batch as
  ``rollout_is_weights`` — the policy loss multiplies its per-token terms by it — and tokens
  failing a rejection test leave ``response_mask``; ``rollout_corr/*`` metrics describe the gap.
* **bypass** (``bypass_mode``): ℓ_old := ℓ_rollout, no old-log-prob pass; the actor trains with
  the bypass loss (``loss_type``), which weights and rejects per micro-batch itself.
"""

from __future__ import annotations

from typing import Literal

from hybridflow import fields as F
from hybridflow.algorithms.rollout_correction import compute_rollout_correction, rollout_corr_diagnostics
from hybridflow.config.actor_rollout_ref import RolloutCorrectionConfig
from hybridflow.protocol import DataProto

CorrectionMode = Literal["off", "decoupled", "bypass"]


def correction_mode(rc: RolloutCorrectionConfig) -> CorrectionMode:
    if rc.bypass_mode:
        return "bypass"
    return "decoupled" if rc.rollout_is is not None or rc.rollout_rs is not None else "off"


def _rollout_log_probs(batch: DataProto, mode: str):
    if F.ROLLOUT_LOG_PROBS not in batch.require_batch().keys():
        raise KeyError(
            f"rollout correction ({mode}) needs {F.ROLLOUT_LOG_PROBS!r} from the rollout "
            "(actor_rollout_ref.rollout.calculate_log_probs=true), and the batch has none"
        )
    return batch.require_batch()[F.ROLLOUT_LOG_PROBS]


def use_rollout_log_probs_as_old(batch: DataProto) -> None:
    """Bypass mode: ℓ_old := ℓ_rollout (the actor then trains against the sampler's policy)."""
    batch.require_batch()[F.OLD_LOG_PROBS] = _rollout_log_probs(batch, "bypass_mode").clone()


def apply_decoupled_correction(batch: DataProto, rc: RolloutCorrectionConfig) -> dict[str, float]:
    """Decoupled mode: ``rollout_is_weights`` and the rejection-filtered ``response_mask`` into
    the batch (in place); returns the ``rollout_corr/*`` metrics."""
    td = batch.require_batch()
    old, rollout, mask = td[F.OLD_LOG_PROBS], _rollout_log_probs(batch, "decoupled"), td[F.RESPONSE_MASK]
    weights, kept, metrics = compute_rollout_correction(
        old,
        rollout,
        mask,
        rollout_is=rc.rollout_is,
        rollout_is_threshold=rc.rollout_is_threshold,
        rollout_is_batch_normalize=rc.rollout_is_batch_normalize,
        rollout_rs=rc.rollout_rs,
        rollout_rs_threshold=rc.rollout_rs_threshold,
    )
    diagnostics = rollout_corr_diagnostics(old, rollout, mask, weights, rc.rollout_is_threshold)
    metrics |= {f"rollout_corr/{name}": value for name, value in diagnostics.items()}
    if weights is not None:
        td[F.ROLLOUT_IS_WEIGHTS] = weights
    td[F.RESPONSE_MASK] = kept
    return {name: float(value) for name, value in metrics.items()}
