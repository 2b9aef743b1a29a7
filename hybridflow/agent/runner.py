"""Run a batch of prompt rows through their agent loops, concurrently, into one ``DataProto``.

Each row picks its loop by the ``agent_name`` column (``default_agent_loop`` where the column
is absent — verl's ``rollout.agent.default_agent_loop``). Every trajectory gets a fresh loop
instance and all of them run at once on one event loop, so a client that batches concurrent
requests sees the whole batch. Rows reach the loops as keyword arguments: every non-tensor
column, plus ``raw_prompt_ids`` read off the left-padded ``input_ids`` when the batch has no
such column. Unknown loop names fail before anything runs.
"""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np

from hybridflow import fields as F
from hybridflow.agent.base import AgentContext, AgentLoopSpec
from hybridflow.agent.collate import collate_trajectories
from hybridflow.data.rl_dataset import RAW_PROMPT_IDS
from hybridflow.inference.protocol import SamplingParams
from hybridflow.protocol import DataProto
from hybridflow.utils.registry import Registry

AGENT_NAME = "agent_name"
DEFAULT_AGENT_LOOP = "single_turn_agent"


def prompt_rows(prompts: DataProto) -> list[dict[str, Any]]:
    """One keyword dict per row: the non-tensor columns, and ``raw_prompt_ids`` if missing."""
    n = len(prompts)
    rows: list[dict[str, Any]] = [{} for _ in range(n)]
    for key, column in prompts.non_tensor_batch.items():
        for i in range(n):
            rows[i][key] = column[i]
    batch = prompts.batch
    if RAW_PROMPT_IDS not in prompts.non_tensor_batch and batch is not None and F.INPUT_IDS in batch.keys():
        input_ids, attention = batch[F.INPUT_IDS], batch[F.ATTENTION_MASK]
        for i in range(n):
            rows[i][RAW_PROMPT_IDS] = input_ids[i][attention[i].bool()].tolist()
    return rows


async def run_agent_loops(
    prompts: DataProto,
    *,
    table: Registry[AgentLoopSpec],
    context: AgentContext,
    sampling: SamplingParams,
    prompt_length: int,
    pad_token_id: int,
    default_agent_loop: str = DEFAULT_AGENT_LOOP,
) -> DataProto:
    """Trajectories for every row of ``prompts`` (one each), collated with verl's fields."""
    rows = prompt_rows(prompts)
    if not rows:
        raise ValueError("run_agent_loops got an empty batch")
    names = [str(row.get(AGENT_NAME) or default_agent_loop) for row in rows]
    for name in sorted(set(names)):
        table.get(name)  # ValueError listing the valid names
    loops = [table.get(name).build(context) for name in names]
    runs = [loop.run(sampling.for_request(i), **row) for i, (loop, row) in enumerate(zip(loops, rows, strict=True))]
    outputs = await asyncio.gather(*runs)  # each row its own random stream (above)
    return collate_trajectories(
        outputs,
        prompt_length=prompt_length,
        response_length=context.response_length,
        pad_token_id=pad_token_id,
        non_tensors={**prompts.non_tensor_batch, **weight_version_columns(loops)},
        meta_info=prompts.meta_info,
    )


def weight_version_columns(loops: list[Any]) -> dict[str, np.ndarray]:
    """Per trajectory, the weight versions of its first and last generated tokens
    (``fields.WEIGHT_VERSION_MIN`` / ``_MAX``; -1 when it generated nothing)."""
    low = [loop.client.min_version for loop in loops]
    high = [loop.client.max_version for loop in loops]
    return {
        F.WEIGHT_VERSION_MIN: np.array([-1 if v is None else v for v in low], dtype=np.int64),
        F.WEIGHT_VERSION_MAX: np.array([-1 if v is None else v for v in high], dtype=np.int64),
    }
