"""``single_turn_agent``: one generation per prompt, the agent-loop form of today's rollout.

The prompt ids are the dataset's own (``raw_prompt_ids``, what the plain rollout feeds the
sampler) when the row has them, else ``raw_prompt`` rendered with the chat template the same
way the dataset renders it. So under greedy sampling the trajectory is token for token what
the plain rollout produces. A row with images (``multi_modal_inputs``) sends them with the
request (:class:`~hybridflow.inference.protocol.PromptImages`: the dataset's ids already hold
the expanded image tokens), with the prompt's 3-D positions; the context must name the model's
vision tokens (``AgentContext.vision``).
"""

from __future__ import annotations

import time
from typing import Any

from hybridflow.agent.base import AGENT_LOOPS, AgentLoopBase, AgentLoopOutput, row_messages
from hybridflow.agent.images import expand_image_tokens, prompt_images, row_image_inputs
from hybridflow.agent.tokens import render_ids
from hybridflow.data.multimodal import to_processor_messages
from hybridflow.data.rl_dataset import RAW_PROMPT_IDS
from hybridflow.inference.protocol import SamplingParams


@AGENT_LOOPS.register("single_turn_agent")
class SingleTurnAgentLoop(AgentLoopBase):
    """See the module docstring."""

    async def run(self, sampling: SamplingParams, **row: Any) -> AgentLoopOutput:
        inputs = row_image_inputs(row)
        prompt_ids = self._prompt_ids(row, inputs)
        images = prompt_images(prompt_ids, inputs, self.context.vision, "single_turn_agent") if inputs else None
        extra = {"images": images} if images is not None else {}
        started = time.perf_counter()
        out = await self.client.generate(self.request_id, prompt_ids, sampling, self.response_length, **extra)
        elapsed = time.perf_counter() - started
        ids = list(out.token_ids[: self.response_length])
        return AgentLoopOutput(
            prompt_ids=prompt_ids,
            response_ids=ids,
            response_mask=[1] * len(ids),
            response_log_probs=[float(x) for x in out.log_probs[: len(ids)]],
            num_turns=2,
            metrics={"generate_sequences": elapsed, "tool_calls": 0.0},
            prompt_positions=images.positions if images is not None else None,
        )

    def _prompt_ids(self, row: dict[str, Any], inputs: Any) -> list[int]:
        ids = row.get(RAW_PROMPT_IDS)
        if ids is not None and len(ids) > 0:
            return [int(i) for i in ids]
        messages = row_messages(row, "single_turn_agent")
        rendered = render_ids(
            self.tokenizer,
            to_processor_messages(messages) if inputs else messages,
            add_generation_prompt=True,
            chat_template_kwargs=self.context.chat_template_kwargs,
        )
        if not inputs or self.context.vision is None:
            return rendered
        return expand_image_tokens(rendered, inputs["image_grid_thw"], self.context.vision)
