"""The sampling loop on plain tensors: prefill once, decode step by step, drop finished rows.

    prompts (B, P) ──dedup──▶ prefill unique prompts ──fan out ×n──▶ rows (B·n)
    repeat: sample a token per live row → record it → rows that hit a stop token finish
            → once ≥ 1/4 of the cache rows are finished, drop them from the cache
            → decode one step for the remaining rows

Identical prompt rows (a trainer that repeats each prompt n times, or ``n > 1`` here) share
one prefill: the prompt's cache rows are copied instead of recomputed. Dropping finished rows
in batches (not one at a time) bounds the cost of the cache copies while keeping at most a
quarter of the decode work wasted.

Vision-language prompts (Qwen2-VL) come with per-row image inputs and per-axis positions
(B, 3, P). Rows are the same prompt only when their images are equal too; each distinct prompt
is prefilled once with its pixels (the vision tower runs once per distinct prompt, whatever
``n``), through a decoder that takes images (:class:`~hybridflow.inference.hf_decoder.HFDecoder`).
Response tokens are text: each one's position is the prompt's largest position + 1, + 2, …,
the same on all three axes (what the model's ``get_rope_index`` gives text after the prompt).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from hybridflow.engine.multimodal_inputs import concat_image_inputs
from hybridflow.engine.shared_prompt import distinct_prompts
from hybridflow.inference.sampling import GenerationParams, sample_next

_COMPACT_FRACTION = 4  # compact once dead rows ≥ cache rows / _COMPACT_FRACTION

ImageRows = Sequence[Mapping[str, torch.Tensor] | None]


class Decoder(Protocol):
    """What the loop needs from a forward implementation (lean or Hugging Face)."""

    def prefill(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor, max_len: int
    ) -> torch.Tensor: ...

    def decode(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor: ...

    def select_rows(self, index: torch.Tensor) -> None: ...

    def refresh_weights(self) -> int: ...

    def invalidate_weights(self) -> None: ...

    def release(self) -> None: ...


@dataclass
class Generated:
    """Responses of one generate call; row ``i`` answers prompt ``i // n``.

    responses (N, T) int64 right-padded with the pad id; log_probs (N, T) float32, 0 on
    padding; lengths (N,) number of response tokens including the stop token.
    """

    responses: torch.Tensor
    log_probs: torch.Tensor
    lengths: torch.Tensor


def _check_prompts(input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor) -> None:
    if input_ids.dim() != 2:
        raise ValueError(f"input_ids must be (batch, prompt_len), got shape {tuple(input_ids.shape)}")
    if attention_mask.shape != input_ids.shape:
        raise ValueError(
            f"attention_mask shape {tuple(attention_mask.shape)} does not match input_ids {tuple(input_ids.shape)}"
        )
    rope_3d = position_ids.dim() == 3 and position_ids.shape[1] == 3
    if position_ids.shape != input_ids.shape and not (rope_3d and position_ids.shape[::2] == input_ids.shape):
        raise ValueError(
            f"position_ids shape {tuple(position_ids.shape)} must be input_ids' {tuple(input_ids.shape)} "
            "or (batch, 3, prompt_len) (per-axis rotary positions)"
        )
    empty = (attention_mask.sum(dim=1) == 0).nonzero()[:, 0]
    if empty.numel():
        raise ValueError(f"prompt rows {empty.tolist()[:8]} have no tokens (attention_mask is all 0)")
    if not bool(attention_mask[:, -1].all()):
        raise ValueError("prompts must be left-padded: the last column of attention_mask must be all 1")


def _last_positions(position_ids: torch.Tensor) -> torch.Tensor:
    """(B,) the position each row's first response token follows: the last column for (B, P)
    positions; the largest position of the row for per-axis (B, 3, P) ones (after an image the
    text resumes past the image's largest position, not at its column count)."""
    return position_ids[:, -1] if position_ids.dim() == 2 else position_ids.amax(dim=(1, 2))


def _prefill_rows(
    decoder: Decoder,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    position_ids: torch.Tensor,
    params: GenerationParams,
    images: ImageRows | None = None,
) -> torch.Tensor:
    """Prefill each distinct prompt once and fan its cache rows out to ``params.n`` responses
    per prompt row; the logits of the first token, one row per response."""
    unique, which = distinct_prompts(input_ids, attention_mask, position_ids, images)
    # The last sampled token is never fed back, so P + T − 1 cache columns suffice.
    max_len = input_ids.shape[1] + params.max_new_tokens - 1
    ids, mask, pos = input_ids[unique], attention_mask[unique], position_ids[unique]
    if images is None and pos.dim() == 2:
        logits = decoder.prefill(ids, mask, pos, max_len)
    else:
        prefill = getattr(decoder, "prefill_multimodal", None)
        if prefill is None:
            raise ValueError(
                f"{type(decoder).__name__} cannot take image inputs or per-axis positions; "
                "vision-language models sample through the HF decoder (decoder='hf')"
            )
        rows = [images[i] for i in unique.tolist()] if images is not None else []
        kwargs = concat_image_inputs(rows, input_ids.device)
        logits = prefill(ids, mask, pos.transpose(0, 1) if pos.dim() == 3 else pos.expand(3, -1, -1), max_len, kwargs)
    fan_out = which.repeat_interleave(params.n)
    if not torch.equal(fan_out, torch.arange(unique.numel(), device=fan_out.device)):
        decoder.select_rows(fan_out)
        logits = logits[fan_out]
    return logits


def _empty_output(rows: int, steps: int, pad_token_id: int, device: torch.device) -> Generated:
    """Responses all padding, log-probs 0, lengths ``steps``, until the loop fills them in."""
    return Generated(
        responses=torch.full((rows, steps), pad_token_id, dtype=torch.long, device=device),
        log_probs=torch.zeros((rows, steps), dtype=torch.float32, device=device),
        lengths=torch.full((rows,), steps, dtype=torch.long, device=device),
    )


@torch.inference_mode()
def generate(
    decoder: Decoder,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    position_ids: torch.Tensor,
    params: GenerationParams,
    pad_token_id: int,
    generator: torch.Generator | None = None,
    on_token: Callable[[int, int], None] | None = None,
    images: ImageRows | None = None,
) -> Generated:
    """Sample ``params.n`` responses for each left-padded prompt row. ``on_token(t, live)``
    is called after each sampled position ``t`` (1-based) with the number of unfinished rows.

    ``position_ids`` (B, P), or (B, 3, P) for a vision-language model; ``images``: one
    image-input dict (``pixel_values``, ``image_grid_thw``) or None per prompt row.
    """
    _check_prompts(input_ids, attention_mask, position_ids)
    if images is not None and len(images) != input_ids.shape[0]:
        raise ValueError(f"images: {len(images)} entries for {input_ids.shape[0]} prompt rows")
    steps = params.max_new_tokens
    logits = _prefill_rows(decoder, input_ids, attention_mask, position_ids, params, images)
    positions = _last_positions(position_ids).repeat_interleave(params.n)
    rows = positions.shape[0]
    out = _empty_output(rows, steps, pad_token_id, input_ids.device)
    stop = torch.tensor(params.stop_token_ids, dtype=torch.long, device=input_ids.device)
    check_stop = stop.numel() > 0 and not params.ignore_eos
    row_ids = torch.arange(rows, device=input_ids.device)  # cache row → output row
    alive = torch.ones(rows, dtype=torch.bool, device=input_ids.device)
    for t in range(steps):
        tokens, log_probs = sample_next(logits, params, generator)
        live_ids = row_ids[alive]
        out.responses[live_ids, t] = tokens[alive]
        out.log_probs[live_ids, t] = log_probs[alive]
        if check_stop:
            hit = alive & torch.isin(tokens, stop)
            out.lengths[row_ids[hit]] = t + 1
            alive &= ~hit
        if on_token is not None:
            on_token(t + 1, int(alive.sum()))
        if t == steps - 1 or not bool(alive.any()):
            break
        dead = int(alive.numel() - alive.sum())
        if dead and dead * _COMPACT_FRACTION >= alive.numel():
            keep = alive.nonzero()[:, 0]
            decoder.select_rows(keep)
            row_ids, tokens, positions, alive = row_ids[keep], tokens[keep], positions[keep], alive[keep]
        positions = positions + 1
        logits = decoder.decode(tokens, positions)
    return out
