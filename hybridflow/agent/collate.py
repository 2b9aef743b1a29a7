"""Trajectories → one ``DataProto`` with the plain rollout's fields, plus holes in the mask.

Downstream phases (old log-probs, reference, advantages, losses) cannot tell an agent batch
from a plain one: the tensors are the same fields with the same shapes and padding —

    prompts (B, P)            prompt ids left-padded to P = prompt_length
    responses (B, T)          response ids (model and inserted tokens) right-padded to T = response_length
    response_mask (B, T)      1 on model tokens; 0 on tool/user/separator tokens and padding
    input_ids (B, P+T)        prompts ‖ responses
    attention_mask (B, P+T)   1 on every real token, inserted ones included
    position_ids (B, P+T)     prompt positions, then last prompt position + 1, + 2, …
                              (B, 3, P+T) when a trajectory's prompt has images: its 3-D
                              positions, then its largest + 1, + 2, … on every axis; text rows
                              count up alike on all three axes
    rollout_log_probs (B, T)  the sampler's log-prob on model tokens, 0 elsewhere

— and the non-tensor columns ``__num_turns__``, ``tool_call_counts``, ``turn_scores``,
``tool_rewards`` (verl's names). Each trajectory is checked first (:func:`check_trajectory`):
lengths agree, the mask is 0/1, masked log-probs are 0, the last response token is the
model's, and it fits the budget. The last check is what puts an outcome reward (placed on
the last attention-valid token) on a token the model produced.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from hybridflow import fields as F
from hybridflow.agent.base import AgentLoopOutput
from hybridflow.data.rl_dataset import left_pad
from hybridflow.inference.positions import response_positions
from hybridflow.protocol import DataProto
from hybridflow.protocol.rows import object_array

NUM_TURNS = "__num_turns__"
TOOL_CALL_COUNTS = "tool_call_counts"
TURN_SCORES = "turn_scores"
TOOL_REWARDS = "tool_rewards"


class TrajectoryError(AssertionError):
    """A trajectory that breaks the response invariants (an agent loop bug, not bad input)."""


def check_trajectory(out: AgentLoopOutput, response_length: int, where: str = "trajectory") -> None:
    """Raise :class:`TrajectoryError` unless ``out`` satisfies the response invariants."""
    n = len(out.response_ids)
    if not (n == len(out.response_mask) == len(out.response_log_probs)):
        raise TrajectoryError(
            f"{where}: response_ids ({n}), response_mask ({len(out.response_mask)}) and response_log_probs "
            f"({len(out.response_log_probs)}) must have one entry per response token"
        )
    if n > response_length:
        raise TrajectoryError(f"{where}: {n} response tokens exceed response_length={response_length}")
    if any(m not in (0, 1) for m in out.response_mask):
        raise TrajectoryError(f"{where}: response_mask must hold only 0 and 1")
    pairs = zip(out.response_mask, out.response_log_probs, strict=True)
    bad = [i for i, (m, lp) in enumerate(pairs) if m == 0 and lp != 0.0]
    if bad:
        raise TrajectoryError(f"{where}: log-probs must be 0 where response_mask is 0 (positions {bad[:5]})")
    if n and out.response_mask[-1] != 1:
        raise TrajectoryError(f"{where}: the last response token must be a model token (mask 1), not inserted context")
    if not out.prompt_ids:
        raise TrajectoryError(f"{where}: the prompt is empty")


def _stats(prefix: str, values: np.ndarray) -> dict[str, float]:
    return {
        f"{prefix}/min": float(values.min()),
        f"{prefix}/max": float(values.max()),
        f"{prefix}/mean": float(values.mean()),
    }


def agent_loop_metrics(outputs: Sequence[AgentLoopOutput]) -> dict[str, float]:
    """Batch metrics under verl's names: ``num_turns/*``, ``tool_call_counts/*``,
    ``agent_loop/generate_sequences/*`` and ``agent_loop/tool_calls/*`` (seconds),
    ``agent_loop/slowest/*`` (the trajectory with the most generate + tool time), plus
    ``agent_loop/{tool_errors,tool_parse_errors,dropped_tool_turns}/*`` counters and
    ``agent_loop/tool_call_validity``: of the calls the batch attempted (calls run + blocks that
    could not be read), the fraction that ran without error (absent when nothing was attempted)."""
    if not outputs:
        return {}
    turns = np.array([o.num_turns for o in outputs], dtype=np.float64)
    calls = np.array([o.tool_call_counts for o in outputs], dtype=np.float64)
    generate = np.array([o.metrics.get("generate_sequences", 0.0) for o in outputs], dtype=np.float64)
    tools = np.array([o.metrics.get("tool_calls", 0.0) for o in outputs], dtype=np.float64)
    metrics = _stats("num_turns", turns) | _stats("tool_call_counts", calls)
    metrics |= _stats("agent_loop/generate_sequences", generate) | _stats("agent_loop/tool_calls", tools)
    slowest = int(np.argmax(generate + tools))
    metrics["agent_loop/slowest/generate_sequences"] = float(generate[slowest])
    metrics["agent_loop/slowest/tool_calls"] = float(tools[slowest])
    metrics["agent_loop/slowest/prompt_length"] = float(len(outputs[slowest].prompt_ids))
    metrics["agent_loop/slowest/response_length"] = float(len(outputs[slowest].response_ids))
    for key in ("tool_errors", "tool_parse_errors", "dropped_tool_turns"):
        values = np.array([o.metrics.get(key, 0.0) for o in outputs], dtype=np.float64)
        metrics |= _stats(f"agent_loop/{key}", values)
    errors = sum(o.metrics.get("tool_errors", 0.0) for o in outputs)
    attempted = calls.sum() + sum(o.metrics.get("tool_parse_errors", 0.0) for o in outputs)
    if attempted > 0:
        metrics["agent_loop/tool_call_validity"] = float((calls.sum() - errors) / attempted)
    return metrics


def collate_trajectories(
    outputs: Sequence[AgentLoopOutput],
    *,
    prompt_length: int,
    response_length: int,
    pad_token_id: int,
    non_tensors: Mapping[str, np.ndarray] | None = None,
    meta_info: Mapping[str, Any] | None = None,
) -> DataProto:
    """One ``DataProto`` row per trajectory (see the module docstring for the fields).

    ``non_tensors`` (one entry per trajectory) are carried along, as the plain rollout
    carries the prompt batch's columns; ``meta_info`` is copied and gets
    ``meta_info["metrics"]`` from :func:`agent_loop_metrics`.
    """
    if not outputs:
        raise ValueError("collate_trajectories needs at least one trajectory")
    _check_images_sent(outputs, (non_tensors or {}).get(F.MULTI_MODAL_INPUTS))
    prompt_parts, response_parts = _padded_rows(outputs, prompt_length, response_length, pad_token_id)
    tensors = _rollout_tensors(prompt_parts, response_parts, response_length)
    columns = _non_tensor_columns(outputs, non_tensors)
    meta = dict(meta_info or {})
    meta["metrics"] = agent_loop_metrics(outputs)
    return DataProto.from_dict(tensors=tensors, non_tensors=columns, meta_info=meta)


def _check_images_sent(outputs: Sequence[AgentLoopOutput], images: Any) -> None:
    """A row with images whose loop sent no images to its client (no ``prompt_positions``) was
    generated from its image tokens without the pixels: an error naming the trajectory."""
    if images is None:
        return
    for i, (out, inputs) in enumerate(zip(outputs, images, strict=False)):
        if inputs and out.prompt_positions is None:
            raise TrajectoryError(
                f"trajectory {i}: the row has images but its loop sent none (prompt_positions unset); a loop "
                "must pass images=PromptImages(...) with its requests (hybridflow/agent/images.py) or refuse the row"
            )


def _padded_rows(
    outputs: Sequence[AgentLoopOutput], prompt_length: int, response_length: int, pad_token_id: int
) -> tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, ...]]:
    """Each trajectory checked, then padded: ``(prompt ids, prompt mask, prompt positions)``
    left-padded to ``prompt_length`` and ``(responses, response attention, response mask,
    log-probs)`` right-padded to ``response_length``, one row per trajectory."""
    prompts, prompt_masks, prompt_positions = [], [], []
    responses = torch.full((len(outputs), response_length), pad_token_id, dtype=torch.long)
    response_attention = torch.zeros((len(outputs), response_length), dtype=torch.long)
    response_mask = torch.zeros((len(outputs), response_length), dtype=torch.long)
    log_probs = torch.zeros((len(outputs), response_length), dtype=torch.float32)
    for i, out in enumerate(outputs):
        check_trajectory(out, response_length, where=f"trajectory {i}")
        if len(out.prompt_ids) > prompt_length:
            raise ValueError(
                f"trajectory {i}: the prompt has {len(out.prompt_ids)} tokens, more than prompt_length={prompt_length} "
                "(a tool loop's prompt includes the tool descriptions); raise rollout.prompt_length"
            )
        ids, mask, positions = left_pad(out.prompt_ids, prompt_length, pad_token_id)
        prompts.append(ids)
        prompt_masks.append(mask)
        prompt_positions.append(positions)
        n = len(out.response_ids)
        responses[i, :n] = torch.tensor(out.response_ids, dtype=torch.long)
        response_attention[i, :n] = 1
        response_mask[i, :n] = torch.tensor(out.response_mask, dtype=torch.long)
        log_probs[i, :n] = torch.tensor(out.response_log_probs, dtype=torch.float32)
    positions = torch.stack(prompt_positions)
    if any(out.prompt_positions is not None for out in outputs):
        positions = _positions_3d(outputs, positions)
    prompt_tensors = (torch.stack(prompts), torch.stack(prompt_masks), positions)
    return prompt_tensors, (responses, response_attention, response_mask, log_probs)


def _positions_3d(outputs: Sequence[AgentLoopOutput], text: torch.Tensor) -> torch.Tensor:
    """(B, 3, P) prompt positions: an image prompt's own, left-padded (0 on padding, as the
    dataset's); a text prompt's (B, P) ones on all three axes."""
    positions = text[:, None, :].expand(-1, 3, -1).clone()
    width = text.shape[1]
    for i, out in enumerate(outputs):
        if out.prompt_positions is None:
            continue
        own = torch.as_tensor(out.prompt_positions, dtype=torch.long)
        if tuple(own.shape) != (3, len(out.prompt_ids)):
            raise TrajectoryError(
                f"trajectory {i}: prompt_positions must be (3, {len(out.prompt_ids)}), got {tuple(own.shape)}"
            )
        positions[i] = 0
        positions[i, :, width - own.shape[1] :] = own
    return positions


def _rollout_tensors(
    prompt_parts: tuple[torch.Tensor, ...], response_parts: tuple[torch.Tensor, ...], response_length: int
) -> dict[str, torch.Tensor]:
    """The plain rollout's fields (module docstring) from the padded prompt and response parts."""
    prompt_ids, prompt_mask, prompt_pos = prompt_parts
    responses, response_attention, response_mask, log_probs = response_parts
    response_pos = response_positions(prompt_pos, response_length)
    attention_mask = torch.cat([prompt_mask, response_attention], dim=1)
    if bool((response_mask > response_attention).any()):
        raise TrajectoryError("response_mask is 1 where attention_mask is 0")
    return {
        F.PROMPTS: prompt_ids,
        F.RESPONSES: responses,
        F.RESPONSE_MASK: response_mask,
        F.INPUT_IDS: torch.cat([prompt_ids, responses], dim=1),
        F.ATTENTION_MASK: attention_mask,
        F.POSITION_IDS: torch.cat([prompt_pos, response_pos], dim=-1),
        F.ROLLOUT_LOG_PROBS: log_probs,
    }


def _non_tensor_columns(
    outputs: Sequence[AgentLoopOutput], non_tensors: Mapping[str, np.ndarray] | None
) -> dict[str, np.ndarray]:
    """The carried columns (one entry per trajectory) and verl's per-trajectory agent columns."""
    columns: dict[str, np.ndarray] = {}
    for key, value in (non_tensors or {}).items():
        if len(value) != len(outputs):
            raise ValueError(f"non_tensors[{key!r}] has {len(value)} entries for {len(outputs)} trajectories")
        columns[key] = value
    columns[NUM_TURNS] = np.array([o.num_turns for o in outputs], dtype=np.int32)
    columns[TOOL_CALL_COUNTS] = np.array([o.tool_call_counts for o in outputs], dtype=np.int64)
    columns[TURN_SCORES] = object_array([list(o.turn_scores) for o in outputs])
    columns[TOOL_REWARDS] = object_array([list(o.tool_rewards) for o in outputs])
    return columns
