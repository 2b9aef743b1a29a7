"""``tool_agent``: generate, run the tool calls, show the results, generate again.

One trajectory::

    prompt → generate → parse calls → run ≤ max_parallel_calls at once → tool messages → generate → …

It stops when a turn makes no call, the client stopped for another reason than a stop token
(``length``, ``aborted``), ``max_assistant_turns`` or ``max_user_turns`` is reached, or the
response budget (``response_length``, model and tool tokens together) is spent. A trajectory
never ends on a tool turn: tool tokens that would leave no room for another generated token
are dropped and the loop stops, so the last response token is always the model's.

Tool results are rendered incrementally (:mod:`hybridflow.agent.tokens`); the model's own
tokens are never re-tokenized. Call problems — unreadable blocks, unknown tools, bad
arguments, exceptions, timeouts, calls beyond ``max_parallel_calls`` — go back to the model
as tool messages, so a step always completes. When the chat template ignores ``tools``, the
tools and the call format are described in the system prompt.

A row with images (``multi_modal_inputs``) is rendered with its ``<image>`` placeholders as
image parts, each image pad expanded to its image's tokens, and every turn's request carries
the same :class:`~hybridflow.inference.protocol.PromptImages`: tool results and later turns are
text after the images, their 3-D positions continuing from the prompt's largest + 1.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from typing import Any

from hybridflow.agent.base import (
    AGENT_LOOPS,
    AgentContext,
    AgentLoopBase,
    AgentLoopOutput,
    row_messages,
)
from hybridflow.agent.images import expand_image_tokens, prompt_images, row_image_inputs
from hybridflow.agent.parsers import ParsedTurn, get_tool_parser
from hybridflow.agent.tokens import IncrementalRenderer, template_facts
from hybridflow.data.multimodal import to_processor_messages
from hybridflow.inference.protocol import PromptImages, SamplingParams
from hybridflow.tools.calls import ToolCallResult, ToolSession, truncate_tool_text

MAX_REPORTED_PARSE_ERRORS = 3


def with_tool_instructions(messages: Sequence[dict[str, Any]], instructions: str) -> list[dict[str, Any]]:
    """``messages`` with ``instructions`` added to the system message (one is created if absent)."""
    out = [dict(m) for m in messages]
    if out and out[0].get("role") == "system" and isinstance(out[0].get("content"), str):
        out[0]["content"] = f"{out[0]['content']}\n\n{instructions}" if out[0]["content"] else instructions
        return out
    return [{"role": "system", "content": instructions}, *out]


def tool_prompt_messages(
    tokenizer: Any,
    messages: Sequence[dict[str, Any]],
    tool_schemas: Sequence[dict[str, Any]],
    *,
    format: str = "hermes",  # noqa: A002 - named after the config key rollout.multi_turn.format
    chat_template_kwargs: Mapping[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """The messages the tool agent renders with ``tool_schemas``: as given when the chat
    template renders ``tools`` itself, else with the tools and the ``format``'s call syntax
    described in the system message. SFT on tool conversations uses it too, so a warm-started
    model sees the same prompt tokens in RL."""
    if not tool_schemas or template_facts(tokenizer, tool_schemas, chat_template_kwargs).uses_tools:
        return [dict(m) for m in messages]
    return with_tool_instructions(messages, get_tool_parser(format).format_instructions(tool_schemas))


@AGENT_LOOPS.register("tool_agent")
class ToolAgentLoop(AgentLoopBase):
    """See the module docstring. Keyword arguments mirror ``rollout.multi_turn``; ``format``
    names the tool parser, ``tool_timeout_s`` bounds one call (None: no bound)."""

    def __init__(
        self,
        context: AgentContext,
        *,
        max_assistant_turns: int | None = None,
        max_user_turns: int | None = None,
        max_parallel_calls: int = 1,
        max_tool_response_length: int = 256,
        tool_response_truncate_side: str = "middle",
        format: str = "hermes",  # noqa: A002 - named after the config key rollout.multi_turn.format
        tool_timeout_s: float | None = 60.0,
    ) -> None:
        super().__init__(context)
        for key, value in (("max_assistant_turns", max_assistant_turns), ("max_user_turns", max_user_turns)):
            if value is not None and value < 1:
                raise ValueError(f"{key} must be >= 1 or None (no limit), got {value}")
        if max_parallel_calls < 1:
            raise ValueError(f"max_parallel_calls must be >= 1, got {max_parallel_calls}")
        if tool_timeout_s is not None and tool_timeout_s <= 0:
            raise ValueError(f"tool_timeout_s must be > 0 or None, got {tool_timeout_s}")
        truncate_tool_text("", max_tool_response_length, tool_response_truncate_side)  # validates both
        self.max_assistant_turns = max_assistant_turns
        self.max_user_turns = max_user_turns
        self.max_parallel_calls = max_parallel_calls
        self.max_tool_response_length = max_tool_response_length
        self.tool_response_truncate_side = tool_response_truncate_side
        self.tool_timeout_s = tool_timeout_s
        self.parser = get_tool_parser(format)
        self.format = format
        self.tools = dict(context.tools)
        self.tool_schemas = [tool.schema for tool in self.tools.values()]

    async def run(self, sampling: SamplingParams, **row: Any) -> AgentLoopOutput:
        inputs = row_image_inputs(row)
        messages = row_messages(row, "tool_agent")
        renderer = IncrementalRenderer(self.tokenizer, self.tool_schemas or None, self.context.chat_template_kwargs)
        messages = tool_prompt_messages(
            self.tokenizer,
            messages,
            self.tool_schemas,
            format=self.format,
            chat_template_kwargs=self.context.chat_template_kwargs,
        )
        images: PromptImages | None = None
        if inputs:
            prompt_ids = renderer.prompt_ids(to_processor_messages(messages))
            if self.context.vision is not None:
                prompt_ids = expand_image_tokens(prompt_ids, inputs["image_grid_thw"], self.context.vision)
            images = prompt_images(prompt_ids, inputs, self.context.vision, "tool_agent")
        else:
            prompt_ids = renderer.prompt_ids(messages)
        session = ToolSession(
            self.tools,
            row.get("tools_kwargs"),
            trajectory_id=self.request_id,
            max_tool_response_length=self.max_tool_response_length,
            tool_response_truncate_side=self.tool_response_truncate_side,
            timeout_s=self.tool_timeout_s,
        )
        state = _Trajectory()
        try:
            await self._loop(sampling, prompt_ids, renderer, session, state, images)
        finally:
            await session.release()
        state.drop_trailing_context()
        return AgentLoopOutput(
            prompt_ids=prompt_ids,
            response_ids=state.ids,
            response_mask=state.mask,
            response_log_probs=state.log_probs,
            num_turns=state.assistant_turns + state.user_turns + 1,
            tool_call_counts=state.tool_calls,
            tool_rewards=state.tool_rewards,
            metrics=state.metrics,
            prompt_positions=images.positions if images is not None else None,
        )

    async def _loop(
        self,
        sampling: SamplingParams,
        prompt_ids: list[int],
        renderer: IncrementalRenderer,
        session: ToolSession,
        state: _Trajectory,
        images: PromptImages | None = None,
    ) -> None:
        extra = {"images": images} if images is not None else {}  # every turn: text after the same images
        while True:
            budget = self.response_length - len(state.ids)
            if budget <= 0:
                return
            started = time.perf_counter()
            turn_sampling = sampling.for_request(state.assistant_turns)  # each turn its own random stream
            out = await self.client.generate(self.request_id, prompt_ids + state.ids, turn_sampling, budget, **extra)
            state.metrics["generate_sequences"] += time.perf_counter() - started
            generated = list(out.token_ids[:budget])
            state.add_model_tokens(generated, out.log_probs[: len(generated)])
            if out.stop_reason != "completed" or len(generated) < len(out.token_ids) or not generated:
                return
            if len(state.ids) >= self.response_length:
                return
            if self.max_assistant_turns is not None and state.assistant_turns >= self.max_assistant_turns:
                return
            if self.max_user_turns is not None and state.user_turns >= self.max_user_turns:
                return
            parsed = self.parser.parse(self.tokenizer.decode(generated, skip_special_tokens=False))
            if not parsed.calls and not parsed.errors:
                return
            started = time.perf_counter()
            tool_messages = await self._run_calls(parsed, session, state)
            state.metrics["tool_calls"] += time.perf_counter() - started
            context_ids = renderer.continuation_ids(generated, tool_messages)
            if len(state.ids) + len(context_ids) >= self.response_length:
                state.metrics["dropped_tool_turns"] += 1
                return
            state.add_context_tokens(context_ids)

    async def _run_calls(self, parsed: ParsedTurn, session: ToolSession, state: _Trajectory) -> list[dict[str, Any]]:
        """Tool messages for one turn's calls: the first ``max_parallel_calls`` run at once,
        then one message naming unreadable blocks and skipped calls, if any."""
        calls = parsed.calls[: self.max_parallel_calls]
        skipped = len(parsed.calls) - len(calls)
        results: list[ToolCallResult] = list(
            await asyncio.gather(*(session.call(call.name, call.arguments) for call in calls))
        )
        state.tool_calls += len(calls)
        state.tool_rewards.extend(r.reward for r in results if r.reward is not None)
        state.metrics["tool_errors"] += sum(r.error for r in results)
        state.metrics["tool_parse_errors"] += len(parsed.errors)
        messages = [{"role": "tool", "content": r.text} for r in results]
        notes = []
        if parsed.errors:
            shown = "; ".join(parsed.errors[:MAX_REPORTED_PARSE_ERRORS])
            more = len(parsed.errors) - MAX_REPORTED_PARSE_ERRORS
            notes.append(
                f"Error: {len(parsed.errors)} tool call(s) could not be read and were skipped: {shown}"
                + (f"; and {more} more" if more > 0 else "")
            )
        if skipped:
            notes.append(
                f"Error: at most {self.max_parallel_calls} tool call(s) run per turn; the other {skipped} were skipped"
            )
        if notes:
            text = truncate_tool_text("\n".join(notes), self.max_tool_response_length, self.tool_response_truncate_side)
            messages.append({"role": "tool", "content": text})
        return messages


class _Trajectory:
    """The growing response of one trajectory and its counters."""

    def __init__(self) -> None:
        self.ids: list[int] = []
        self.mask: list[int] = []
        self.log_probs: list[float] = []
        self.assistant_turns = 0
        self.user_turns = 0
        self.tool_calls = 0
        self.tool_rewards: list[float] = []
        self.metrics: dict[str, float] = {
            "generate_sequences": 0.0,
            "tool_calls": 0.0,
            "tool_errors": 0.0,
            "tool_parse_errors": 0.0,
            "dropped_tool_turns": 0.0,
        }

    def add_model_tokens(self, ids: list[int], log_probs: Sequence[float]) -> None:
        self.ids += ids
        self.mask += [1] * len(ids)
        self.log_probs += [float(x) for x in log_probs]
        self.assistant_turns += 1

    def add_context_tokens(self, ids: list[int]) -> None:
        self.ids += ids
        self.mask += [0] * len(ids)
        self.log_probs += [0.0] * len(ids)
        self.user_turns += 1

    def drop_trailing_context(self) -> None:
        """Keep the last token the model's: a final turn that generated nothing leaves the
        tool turn before it last, so that tool turn goes."""
        if self.mask and self.mask[-1] == 0:
            while self.mask and self.mask[-1] == 0:
                self.ids.pop()
                self.mask.pop()
                self.log_probs.pop()
            self.user_turns -= 1
