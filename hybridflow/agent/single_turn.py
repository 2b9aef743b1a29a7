"""``single_turn_agent``: one generation per prompt, the agent-loop form of today's rollout.

The prompt ids are the dataset's own (``raw_prompt_ids``, what the plain rollout feeds the
sampler) when the row has them, else ``raw_prompt`` rendered with the chat template the same
way the dataset renders it. So under greedy sampling the trajectory is token for token what
the plain rollout produces. Rows with images never reach it on the built-in rollout (which
serves them with its image-taking sampler); given one through a token client, it refuses it.
"""

from __future__ import annotations

import time
from typing import Any

from hybridflow.agent.base import AGENT_LOOPS, AgentLoopBase, AgentLoopOutput, refuse_images, row_messages
from hybridflow.agent.tokens import render_ids
from hybridflow.data.rl_dataset import RAW_PROMPT_IDS
from hybridflow.inference.protocol import SamplingParams


@AGENT_LOOPS.register("single_turn_agent")
class SingleTurnAgentLoop(AgentLoopBase):
    """See the module docstring."""

    async def run(self, sampling: SamplingParams, **row: Any) -> AgentLoopOutput:
        refuse_images(row, "single_turn_agent")
        prompt_ids = self._prompt_ids(row)
        started = time.perf_counter()
        out = await self.client.generate(self.request_id, prompt_ids, sampling, self.response_length)
        elapsed = time.perf_counter() - started
        ids = list(out.token_ids[: self.response_length])
        return AgentLoopOutput(
            prompt_ids=prompt_ids,
            response_ids=ids,
            response_mask=[1] * len(ids),
            response_log_probs=[float(x) for x in out.log_probs[: len(ids)]],
            num_turns=2,
            metrics={"generate_sequences": elapsed, "tool_calls": 0.0},
        )

    def _prompt_ids(self, row: dict[str, Any]) -> list[int]:
        ids = row.get(RAW_PROMPT_IDS)
        if ids is not None and len(ids) > 0:
            return [int(i) for i in ids]
        return render_ids(
            self.tokenizer,
            row_messages(row, "single_turn_agent"),
            add_generation_prompt=True,
            chat_template_kwargs=self.context.chat_template_kwargs,
        )
