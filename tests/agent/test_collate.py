"""Trajectories → DataProto: verl's fields, padding, positions, the invariants, the metrics."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hybridflow import fields as F
from hybridflow.agent.base import AgentLoopOutput
from hybridflow.agent.collate import (
    TrajectoryError,
    agent_loop_metrics,
    check_trajectory,
    collate_trajectories,
)

PAD = 0


def traj(prompt, response, mask, log_probs=None, **kwargs) -> AgentLoopOutput:
    if log_probs is None:
        log_probs = [-0.5 if m else 0.0 for m in mask]
    return AgentLoopOutput(prompt, response, mask, log_probs, num_turns=kwargs.pop("num_turns", 2), **kwargs)


def test_fields_padding_masks_and_positions():
    a = traj([11, 12], [21, 22, 23, 24, 25], [1, 1, 0, 0, 1], [-0.1, -0.2, 0.0, 0.0, -0.3], num_turns=4,
             tool_call_counts=1, tool_rewards=[0.5], metrics={"generate_sequences": 2.0, "tool_calls": 1.0})
    b = traj([13, 14, 15], [26], [1], [-0.4], metrics={"generate_sequences": 1.0})
    batch = collate_trajectories([a, b], prompt_length=4, response_length=6, pad_token_id=PAD,
                                 non_tensors={"uid": np.array(["u0", "u1"], dtype=object)}, meta_info={"step": 3})
    t = batch.batch
    assert t[F.PROMPTS].tolist() == [[0, 0, 11, 12], [0, 13, 14, 15]]
    assert t[F.RESPONSES].tolist() == [[21, 22, 23, 24, 25, 0], [26, 0, 0, 0, 0, 0]]
    assert t[F.RESPONSE_MASK].tolist() == [[1, 1, 0, 0, 1, 0], [1, 0, 0, 0, 0, 0]]
    assert t[F.INPUT_IDS].tolist() == [[0, 0, 11, 12, 21, 22, 23, 24, 25, 0], [0, 13, 14, 15, 26, 0, 0, 0, 0, 0]]
    assert t[F.ATTENTION_MASK].tolist() == [[0, 0, 1, 1, 1, 1, 1, 1, 1, 0], [0, 1, 1, 1, 1, 0, 0, 0, 0, 0]]
    # the plain rollout's convention: prompt positions from 0, then +1 per response slot
    assert t[F.POSITION_IDS].tolist() == [[0, 0, 0, 1, 2, 3, 4, 5, 6, 7], [0, 0, 1, 2, 3, 4, 5, 6, 7, 8]]
    assert torch.allclose(t[F.ROLLOUT_LOG_PROBS][0], torch.tensor([-0.1, -0.2, 0.0, 0.0, -0.3, 0.0]))
    assert t[F.ROLLOUT_LOG_PROBS].dtype == torch.float32 and t[F.RESPONSES].dtype == torch.long
    # response_mask ≤ attention_mask; log-probs 0 where the mask is 0
    assert (t[F.RESPONSE_MASK] <= t[F.ATTENTION_MASK][:, 4:]).all()
    assert (t[F.ROLLOUT_LOG_PROBS][t[F.RESPONSE_MASK] == 0] == 0).all()
    nt = batch.non_tensor_batch
    assert nt["__num_turns__"].tolist() == [4, 2] and nt["__num_turns__"].dtype == np.int32
    assert nt["tool_call_counts"].tolist() == [1, 0]
    assert nt["tool_rewards"].tolist() == [[0.5], []] and nt["turn_scores"].tolist() == [[], []]
    assert nt["uid"].tolist() == ["u0", "u1"]
    assert batch.meta_info["step"] == 3
    metrics = batch.meta_info["metrics"]
    assert metrics["num_turns/min"] == 2 and metrics["num_turns/max"] == 4 and metrics["num_turns/mean"] == 3
    assert metrics["tool_call_counts/mean"] == 0.5
    assert metrics["agent_loop/generate_sequences/max"] == 2.0 and metrics["agent_loop/tool_calls/mean"] == 0.5
    assert metrics["agent_loop/slowest/response_length"] == 5 and metrics["agent_loop/slowest/prompt_length"] == 2


def test_the_last_attention_valid_response_token_is_a_model_token():
    out = traj([1], [5, 6, 7, 8], [1, 0, 0, 1])
    batch = collate_trajectories([out], prompt_length=2, response_length=8, pad_token_id=PAD)
    attention, mask = batch.batch[F.ATTENTION_MASK][0, 2:], batch.batch[F.RESPONSE_MASK][0]
    assert mask[int(attention.nonzero().max())] == 1


@pytest.mark.parametrize(
    ("out", "message"),
    [
        (traj([1], [5, 6], [1]), "one entry per response token"),
        (traj([1], [5, 6], [1, 1], [-0.1]), "one entry per response token"),
        (traj([1], [5, 6], [1, 2]), "only 0 and 1"),
        (traj([1], [5, 6, 7], [1, 0, 1], [-0.1, -0.2, -0.3]), r"log-probs must be 0 where response_mask is 0 \(positions \[1\]\)"),
        (traj([1], [5, 6], [1, 0]), "last response token must be a model token"),
        (traj([], [5], [1]), "prompt is empty"),
        (traj([1], [5] * 9, [1] * 9), "exceed response_length=8"),
    ],
)
def test_broken_trajectories_are_refused(out, message):
    with pytest.raises(TrajectoryError, match=message):
        check_trajectory(out, response_length=8)
    with pytest.raises(TrajectoryError):  # also an AssertionError, as verl's checks are
        collate_trajectories([out], prompt_length=4, response_length=8, pad_token_id=PAD)
    assert issubclass(TrajectoryError, AssertionError)


def test_an_over_long_prompt_names_the_setting():
    with pytest.raises(ValueError, match="raise rollout.prompt_length"):
        collate_trajectories([traj([1, 2, 3], [4], [1])], prompt_length=2, response_length=4, pad_token_id=PAD)


def test_an_empty_response_is_allowed():
    batch = collate_trajectories([traj([1], [], [])], prompt_length=2, response_length=3, pad_token_id=PAD)
    assert batch.batch[F.RESPONSE_MASK].sum() == 0 and batch.batch[F.ATTENTION_MASK].tolist() == [[0, 1, 0, 0, 0]]


def test_metric_names_are_verls():
    names = set(agent_loop_metrics([traj([1], [2], [1])]))
    for prefix in ("num_turns", "tool_call_counts", "agent_loop/generate_sequences", "agent_loop/tool_calls"):
        assert {f"{prefix}/min", f"{prefix}/max", f"{prefix}/mean"} <= names
    assert {"agent_loop/slowest/generate_sequences", "agent_loop/slowest/tool_calls"} <= names


def test_tool_call_validity_counts_unreadable_blocks_and_failed_calls():
    outputs = [
        traj([1], [2], [1], tool_call_counts=3, metrics={"tool_errors": 1.0, "tool_parse_errors": 1.0}),
        traj([1], [2], [1], tool_call_counts=1, metrics={"tool_errors": 0.0, "tool_parse_errors": 0.0}),
        traj([1], [2], [1], tool_call_counts=0, metrics={"tool_errors": 0.0, "tool_parse_errors": 0.0}),
    ]
    # attempted: 4 calls run + 1 unreadable block = 5; valid: 4 - 1 failed = 3
    assert agent_loop_metrics(outputs)["agent_loop/tool_call_validity"] == pytest.approx(3 / 5)
    assert "agent_loop/tool_call_validity" not in agent_loop_metrics([traj([1], [2], [1])])
