"""Rollout correction: importance weights and rejection masks for rollout/training mismatch.

When the sampler (e.g. a bf16 inference engine, or a stale policy) differs from the policy being
trained, each token carries the log-ratio δ = ℓ_train − ℓ_rollout. Two tools use it:

* **IS weights** (``rollout_is``): ``token`` → w_t = exp(clamp(δ_t, ±20)); ``sequence`` →
  w_i = exp(clamp(Σ_t δ_t m_t, ±20)) on every token of the row. Then, with a single threshold U
  (``rollout_is_threshold``, default 2.0): truncated IS, w ← min(w, U); with ``"L_U"``: IcePop,
  w ← w if L ≤ w ≤ U else 0. Weights are detached and 0 where m = 0. ``rollout_is_batch_normalize``
  divides by their mean over the (local) batch.
* **Rejection** (``rollout_rs``, comma-separated options, all must pass): per-token statistics
  k1 = −δ, k2 = ½δ², k3 = exp(δ) − 1 − δ (δ clamped to ±20), used as ``token_k{1,2,3}``,
  ``seq_sum_k{1,2,3}`` / ``seq_mean_k{1,2,3}`` (masked sum / mean over the row) or
  ``seq_max_k{2,3}``; ``binary_kl`` is max of the two Bernoulli KLs between π_train and
  π_rollout of the token. k1 options keep log L ≤ stat ≤ log U (``"L_U"``, or U with L = 1/U);
  the others keep stat ≤ U. Rejected tokens get mask 0.

Reference: "When Speed Kills Stability: Demystifying RL Collapse from the Training-Inference
Mismatch" (https://richardli.xyz/rl-collapse). Metric values are detached tensors.
"""

from __future__ import annotations

import math

import torch

from hybridflow.algorithms.utils import masked_mean, masked_sum

SAFETY_BOUND = 20.0
ROLLOUT_IS_LEVELS: tuple[str, ...] = ("token", "sequence")
ROLLOUT_RS_OPTIONS: tuple[str, ...] = (
    "token_k1", "token_k2", "token_k3",
    "seq_sum_k1", "seq_sum_k2", "seq_sum_k3",
    "seq_mean_k1", "seq_mean_k2", "seq_mean_k3",
    "seq_max_k2", "seq_max_k3",
    "binary_kl",
)  # fmt: skip


def _parse_bounds(spec: float | str, what: str) -> tuple[float, float | None]:
    """``U`` → (U, None); ``"L_U"`` → (U, L). Both must be > 0 and L ≤ U."""
    if isinstance(spec, bool) or not isinstance(spec, int | float | str):
        raise ValueError(f"{what} must be a number or a 'lower_upper' string, got {spec!r}")
    text = str(spec).strip()
    try:
        lower_text, upper_text = text.split("_", 1) if "_" in text else (None, text)
        upper = float(upper_text)
        lower = None if lower_text is None else float(lower_text)
    except ValueError:
        raise ValueError(f"{what}: cannot parse {spec!r} as 'upper' or 'lower_upper'") from None
    if upper <= 0 or (lower is not None and not 0 < lower <= upper):
        raise ValueError(f"{what}: need 0 < lower <= upper, got {spec!r}")
    return upper, lower


def compute_rollout_is_weights(
    log_ratio: torch.Tensor,
    response_mask: torch.Tensor,
    rollout_is: str = "token",
    rollout_is_threshold: float | str = 2.0,
    rollout_is_batch_normalize: bool = False,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """IS weights (B, T), detached, from δ = ℓ_train − ℓ_rollout (B, T); see the module docstring."""
    if rollout_is not in ROLLOUT_IS_LEVELS:
        raise ValueError(f"unknown rollout_is {rollout_is!r}; valid: {', '.join(ROLLOUT_IS_LEVELS)}")
    upper, lower = _parse_bounds(rollout_is_threshold, "rollout_is_threshold")
    log_ratio = log_ratio.detach()
    if rollout_is == "token":
        log_w = log_ratio
    else:
        log_w = masked_sum(log_ratio, response_mask, axis=-1).unsqueeze(-1).expand_as(log_ratio)
    raw = torch.exp(log_w.clamp(-SAFETY_BOUND, SAFETY_BOUND)) * response_mask
    if lower is None:
        weights = raw.clamp(max=upper)
    else:
        weights = torch.where((raw >= lower) & (raw <= upper), raw, torch.zeros_like(raw))
    lower_for_metrics = 1.0 / upper if lower is None else lower
    metrics = {
        "rollout_is_mean": masked_mean(weights, response_mask),
        "rollout_is_ratio_fraction_high": masked_mean((raw > upper).float(), response_mask),
        "rollout_is_ratio_fraction_low": masked_mean((raw < lower_for_metrics).float(), response_mask),
    }
    if rollout_is_batch_normalize:
        if rollout_is == "token":
            mean = masked_mean(weights, response_mask)
        else:
            seq_valid = (response_mask.sum(dim=-1) > 0).to(weights.dtype)
            mean = masked_mean(masked_mean(weights, response_mask, axis=-1), seq_valid)
        # torch.where keeps this sync-free: a (near) zero mean leaves the weights as they are
        mean = torch.where(mean > 1e-8, mean, torch.ones_like(mean))
        weights = weights / mean
        metrics["rollout_is_batch_norm_factor"] = mean
    return weights, {key: value.detach() for key, value in metrics.items()}


def _binary_kl(log_p: torch.Tensor, log_q: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """KL(Bern(p) ‖ Bern(q)) from log-probs, p and q clamped to [eps, 1 − eps] in float32."""
    p = torch.exp(log_p.float()).clamp(eps, 1 - eps)
    q = torch.exp(log_q.float()).clamp(eps, 1 - eps)
    return (p * torch.log(p / q) + (1 - p) * torch.log((1 - p) / (1 - q))).to(log_p.dtype)


def _rejection_statistic(
    option: str,
    log_ratio: torch.Tensor,
    mask: torch.Tensor,
    old_log_prob: torch.Tensor | None,
    rollout_log_prob: torch.Tensor | None,
) -> torch.Tensor:
    """The option's statistic broadcast to (B, T)."""
    if option == "binary_kl":
        if old_log_prob is None or rollout_log_prob is None:
            raise ValueError("rollout_rs option 'binary_kl' needs old_log_prob and rollout_log_prob")
        return torch.maximum(_binary_kl(old_log_prob, rollout_log_prob), _binary_kl(rollout_log_prob, old_log_prob))
    delta = log_ratio.clamp(-SAFETY_BOUND, SAFETY_BOUND)
    per_token = {"k1": -delta, "k2": 0.5 * delta**2, "k3": torch.exp(delta) - 1.0 - delta}[option[-2:]]
    if option.startswith("token_"):
        return per_token
    if option.startswith("seq_sum_"):
        per_seq = masked_sum(per_token, mask, axis=-1)
    elif option.startswith("seq_mean_"):
        per_seq = masked_mean(per_token, mask, axis=-1)
    else:  # seq_max_
        per_seq = per_token.masked_fill(~mask.bool(), float("-inf")).max(dim=-1).values
        per_seq = torch.where(torch.isinf(per_seq), torch.zeros_like(per_seq), per_seq)
    return per_seq.unsqueeze(-1).expand_as(per_token)


def compute_rollout_rejection_mask(
    log_ratio: torch.Tensor,
    response_mask: torch.Tensor,
    rollout_rs: str,
    rollout_rs_threshold: float | str,
    old_log_prob: torch.Tensor | None = None,
    rollout_log_prob: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """``response_mask`` with rejected tokens set to 0 (module docstring), and metrics.

    ``rollout_rs_threshold``: one spec shared by all options, or one per option separated by
    commas, in the option order.
    """
    options = list(dict.fromkeys(opt.strip() for opt in rollout_rs.split(",") if opt.strip()))
    unknown = [opt for opt in options if opt not in ROLLOUT_RS_OPTIONS]
    if not options or unknown:
        raise ValueError(f"bad rollout_rs {rollout_rs!r}; valid options: {', '.join(ROLLOUT_RS_OPTIONS)}")
    specs = [part.strip() for part in str(rollout_rs_threshold).split(",") if part.strip()]
    if len(specs) == 1:
        specs = specs * len(options)
    if len(specs) != len(options):
        raise ValueError(f"rollout_rs_threshold has {len(specs)} entries for {len(options)} rollout_rs options")
    keep = torch.ones_like(log_ratio, dtype=torch.bool)
    metrics: dict[str, torch.Tensor] = {}
    for option, spec in zip(options, specs, strict=True):
        upper, lower = _parse_bounds(spec, f"rollout_rs_threshold for {option}")
        stat = _rejection_statistic(option, log_ratio.detach(), response_mask, old_log_prob, rollout_log_prob)
        if option.endswith("k1"):
            low = math.log(1.0 / upper if lower is None else lower)
            passed = (stat >= low) & (stat <= math.log(upper))
        elif lower is not None:
            raise ValueError(f"rollout_rs option {option} takes a single upper bound, got {spec!r}")
        else:
            passed = stat <= upper
        metrics[f"rollout_rs_{option}_masked_fraction"] = masked_mean((~passed).float(), response_mask).detach()
        keep = keep & passed
    new_mask = (response_mask * keep).to(response_mask.dtype)
    metrics["rollout_rs_masked_fraction"] = masked_mean((~keep).float(), response_mask).detach()
    rows = response_mask.sum(dim=-1) > 0
    cut_rows = ((response_mask > 0) & ~keep).any(dim=-1)
    metrics["rollout_rs_seq_masked_fraction"] = (
        cut_rows[rows].float().mean() if rows.any() else torch.zeros((), device=keep.device)
    ).detach()
    return new_mask, metrics


def rollout_corr_diagnostics(
    old_log_prob: torch.Tensor,
    rollout_log_prob: torch.Tensor,
    response_mask: torch.Tensor,
    weights: torch.Tensor | None = None,
    rollout_is_threshold: float | str = 2.0,
) -> dict[str, torch.Tensor]:
    """How far the sampler's distribution is from the trained policy's, on the sampled tokens
    (names as verl's ``rollout_corr/*``, without the prefix). With δ = ℓ_train − ℓ_rollout,
    ρ = exp(δ), per-row means ℓ̄ over the response:

    * ``training_ppl`` / ``rollout_ppl``: batch mean of exp(−ℓ̄) per row; ``*_log_ppl``: mean −ℓ̄;
      ``log_ppl_diff`` = mean(ℓ̄_rollout − ℓ̄_train) (with ``_abs``, ``_max``, ``_min``),
      ``ppl_ratio`` = mean exp(ℓ̄_rollout − ℓ̄_train);
    * ``chi2_token`` = E_t[ρ²] − 1, ``chi2_seq`` = E_i[(Π_t ρ_t)²] − 1 (log-ratios clamped ±20);
    * with ``weights`` (B, T): ``rollout_is_{mean,std,min,max}`` over the response tokens and
      ``rollout_is_eff_sample_size`` = 1 / E[ŵ²] with ŵ = w clamped to [L, U] / its mean
      (1 = uniform weights; small = a few tokens carry the update).
    """
    mask = response_mask.to(old_log_prob.dtype)
    rows = mask.sum(dim=-1) > 0
    if not rows.any():
        return {}
    mean_train = masked_mean(old_log_prob, mask, axis=-1)[rows]
    mean_rollout = masked_mean(rollout_log_prob, mask, axis=-1)[rows]
    diff = mean_rollout - mean_train
    delta = (old_log_prob - rollout_log_prob).clamp(-SAFETY_BOUND, SAFETY_BOUND)
    seq_delta = masked_sum(old_log_prob - rollout_log_prob, mask, axis=-1)[rows].clamp(-SAFETY_BOUND, SAFETY_BOUND)
    metrics = {
        "training_ppl": torch.exp(-mean_train).mean(),
        "training_log_ppl": (-mean_train).mean(),
        "rollout_ppl": torch.exp(-mean_rollout).mean(),
        "rollout_log_ppl": (-mean_rollout).mean(),
        "log_ppl_diff": diff.mean(),
        "log_ppl_abs_diff": diff.abs().mean(),
        "log_ppl_diff_max": diff.max(),
        "log_ppl_diff_min": diff.min(),
        "ppl_ratio": torch.exp(diff).mean(),
        "chi2_token": masked_mean(torch.exp(2 * delta), mask) - 1.0,
        "chi2_seq": torch.exp(2 * seq_delta).mean() - 1.0,
    }
    if weights is not None:
        metrics |= _is_weight_stats(weights, mask, rollout_is_threshold)
    return {key: value.detach() for key, value in metrics.items()}


def _is_weight_stats(
    weights: torch.Tensor, mask: torch.Tensor, rollout_is_threshold: float | str
) -> dict[str, torch.Tensor]:
    """``rollout_is_*`` of :func:`rollout_corr_diagnostics`: the weights over the response tokens,
    and the effective sample size of the weights clamped to the threshold's bounds."""
    values = weights[mask > 0]
    upper, lower = _parse_bounds(rollout_is_threshold, "rollout_is_threshold")
    clamped = values.clamp(min=1.0 / upper if lower is None else lower, max=upper)
    return {
        "rollout_is_mean": values.mean(),
        "rollout_is_std": values.std(unbiased=False),
        "rollout_is_min": values.min(),
        "rollout_is_max": values.max(),
        "rollout_is_eff_sample_size": 1.0 / (clamped / (clamped.mean() + 1e-8)).square().mean(),
    }


def compute_rollout_correction(
    old_log_prob: torch.Tensor,
    rollout_log_prob: torch.Tensor,
    response_mask: torch.Tensor,
    rollout_is: str | None = None,
    rollout_is_threshold: float | str = 2.0,
    rollout_is_batch_normalize: bool = False,
    rollout_rs: str | None = None,
    rollout_rs_threshold: float | str | None = None,
) -> tuple[torch.Tensor | None, torch.Tensor, dict[str, torch.Tensor]]:
    """IS weights (None when ``rollout_is`` is None), the rejection-filtered mask, and metrics.

    ``old_log_prob`` = the training policy's log-probs, ``rollout_log_prob`` = the sampler's,
    both (B, T). Metrics are prefixed ``rollout_corr/`` and include ``kl`` = masked mean of
    ℓ_rollout − ℓ_train and ``k3_kl``.
    """
    if old_log_prob.shape != rollout_log_prob.shape or old_log_prob.shape != response_mask.shape:
        raise ValueError(
            f"old_log_prob {tuple(old_log_prob.shape)}, rollout_log_prob {tuple(rollout_log_prob.shape)} "
            f"and response_mask {tuple(response_mask.shape)} must have the same shape"
        )
    log_ratio = (old_log_prob - rollout_log_prob).detach()
    metrics: dict[str, torch.Tensor] = {}
    weights = None
    if rollout_is is not None:
        weights, is_metrics = compute_rollout_is_weights(
            log_ratio, response_mask, rollout_is, rollout_is_threshold, rollout_is_batch_normalize
        )
        metrics.update(is_metrics)
    mask = response_mask
    if rollout_rs is not None:
        if rollout_rs_threshold is None:
            raise ValueError("rollout_rs is set but rollout_rs_threshold is not")
        mask, rs_metrics = compute_rollout_rejection_mask(
            log_ratio, response_mask, rollout_rs, rollout_rs_threshold, old_log_prob, rollout_log_prob
        )
        metrics.update(rs_metrics)
    delta = log_ratio.clamp(-SAFETY_BOUND, SAFETY_BOUND)
    metrics["kl"] = masked_mean(-log_ratio, response_mask)
    metrics["k3_kl"] = masked_mean(torch.exp(delta) - 1 - delta, response_mask)
    return weights, mask, {f"rollout_corr/{key}": value.detach() for key, value in metrics.items()}
