"""``tool_agent`` with a scripted client: masks, inserted context, turn limits, budget, tools."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
import torch

from hybridflow import fields as F
from hybridflow.agent.base import AgentContext
from hybridflow.agent.collate import collate_trajectories
from hybridflow.agent.tool_agent import ToolAgentLoop
from hybridflow.inference.protocol import SamplingParams
from hybridflow.tools.base import BaseTool, function_tool
from hybridflow.tools.calculator import CalculatorTool

GREEDY = SamplingParams(temperature=0.0)
PROMPT = [{"role": "user", "content": "What is 12*7?"}]
BUDGET = 1000  # the tiny byte-level tokenizer spends about one token per character


def call(name: str, arguments: Any) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


def run_loop(tokenizer, client, tools=(), response_length=BUDGET, row=None, **kwargs):
    context = AgentContext(
        client=client, tokenizer=tokenizer, response_length=response_length, tools={t.name: t for t in tools}
    )
    loop = ToolAgentLoop(context, **kwargs)
    return asyncio.run(loop.run(GREEDY, raw_prompt=PROMPT, **(row or {})))


def context_segments(out) -> list[list[int]]:
    """The runs of inserted (mask 0) tokens, in order."""
    segments, current = [], []
    for token, mask in zip(out.response_ids, out.response_mask, strict=True):
        if mask == 0:
            current.append(token)
        elif current:
            segments.append(current)
            current = []
    return segments + ([current] if current else [])


def test_model_tokens_tool_context_separator_and_log_probs(smol_tokenizer, scripted, turn_ids):
    tok = smol_tokenizer
    turn1 = turn_ids(tok, "Let me compute. " + call("calculator", {"expression": "12*7"}))
    turn2 = turn_ids(tok, "The answer is 84.")
    client = scripted([turn1, turn2])
    out = run_loop(tok, client, [CalculatorTool()], max_parallel_calls=1)
    batch = collate_trajectories([out], prompt_length=1000, response_length=BUDGET, pad_token_id=tok.pad_token_id)
    responses, mask = batch.batch[F.RESPONSES][0], batch.batch[F.RESPONSE_MASK][0]
    attention = batch.batch[F.ATTENTION_MASK][0, 1000:]
    # responses[response_mask == 1] is exactly the model's two turns, token for token
    assert responses[mask == 1].tolist() == turn1 + turn2
    assert tok.decode(responses[mask == 1]) == tok.decode(turn1) + tok.decode(turn2)
    # the tool result is context: attention 1, mask 0, after the separator "\n"
    inserted = responses[(attention == 1) & (mask == 0)].tolist()
    assert tok.decode(inserted) == "\n<|im_start|>tool\n84<|im_end|>\n<|im_start|>assistant\n"
    assert inserted[0] == tok.encode("\n", add_special_tokens=False)[0]
    assert responses[len(turn1)].item() == inserted[0]
    # log-probs: the sampler's on model tokens, 0 on inserted tokens and padding
    log_probs = batch.batch[F.ROLLOUT_LOG_PROBS][0]
    expected = [client.log_prob(0, j) for j in range(len(turn1))] + [client.log_prob(1, j) for j in range(len(turn2))]
    assert torch.allclose(log_probs[mask == 1], torch.tensor(expected))
    assert (log_probs[mask == 0] == 0).all()
    # counts: user prompt + 2 assistant turns + 1 tool turn
    assert out.num_turns == 4 and out.tool_call_counts == 1 and out.tool_rewards == [0.0]
    assert batch.non_tensor_batch["__num_turns__"].tolist() == [4]
    # the second request continued the running list, with one request id for the trajectory
    assert client.calls[1]["prompt_ids"] == out.prompt_ids + out.response_ids[: len(turn1) + len(inserted)]
    assert client.calls[0]["request_id"] == client.calls[1]["request_id"]
    assert client.calls[1]["max_tokens"] == BUDGET - len(turn1) - len(inserted)


def test_tools_are_described_in_the_system_prompt_when_the_template_ignores_them(smol_tokenizer, scripted, turn_ids):
    tok = smol_tokenizer
    out = run_loop(tok, scripted([turn_ids(tok, "Hi")]), [CalculatorTool()])
    prompt = tok.decode(out.prompt_ids)
    assert prompt.startswith("<|im_start|>system\nYou can call tools")
    assert '"name": "calculator"' in prompt and "<tool_call>" in prompt
    assert "SmolLM" not in prompt  # our system message replaces the template's default one


def test_qwen2_template_renders_tools_itself_and_wraps_results(qwen_tokenizer, scripted, turn_ids):
    tok = qwen_tokenizer
    turn1 = turn_ids(tok, call("calculator", {"expression": "12*7"}) + "\n" + call("calculator", {"expression": "2+2"}))
    turn2 = turn_ids(tok, "84 and 4.")
    out = run_loop(tok, scripted([turn1, turn2]), [CalculatorTool()], max_parallel_calls=2)
    prompt = tok.decode(out.prompt_ids)
    assert "# Tools" in prompt and "You can call tools" not in prompt
    (segment,) = context_segments(out)
    assert tok.decode(segment) == (
        "\n<|im_start|>user\n<tool_response>\n84\n</tool_response>\n<tool_response>\n4\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert out.tool_call_counts == 2 and out.num_turns == 4


def test_no_tool_call_ends_the_trajectory_after_one_turn(smol_tokenizer, scripted, turn_ids):
    tok = smol_tokenizer
    turn = turn_ids(tok, "84.")
    client = scripted([turn, turn])
    out = run_loop(tok, client, [CalculatorTool()])
    assert out.response_ids == turn and out.response_mask == [1] * len(turn)
    assert len(client.calls) == 1 and out.num_turns == 2 and out.tool_call_counts == 0


def test_tool_tokens_that_would_overflow_are_dropped_and_the_trajectory_ends_on_the_model(
    smol_tokenizer, scripted, turn_ids
):
    tok = smol_tokenizer
    turn1 = turn_ids(tok, call("calculator", {"expression": "12*7"}))
    client = scripted([turn1, turn_ids(tok, "84")])
    budget = len(turn1) + 5  # the tool turn needs more than 5 tokens
    out = run_loop(tok, client, [CalculatorTool()], response_length=budget)
    assert out.response_ids == turn1 and out.response_mask == [1] * len(turn1)
    assert out.num_turns == 2 and out.tool_call_counts == 1
    assert out.metrics["dropped_tool_turns"] == 1
    assert len(client.calls) == 1
    batch = collate_trajectories([out], prompt_length=1000, response_length=budget, pad_token_id=tok.pad_token_id)
    mask, attention = batch.batch[F.RESPONSE_MASK][0], batch.batch[F.ATTENTION_MASK][0, 1000:]
    last = int(attention.nonzero().max())
    assert mask[last] == 1


def test_the_budget_covers_tool_tokens_and_cuts_the_last_turn(smol_tokenizer, scripted, turn_ids):
    tok = smol_tokenizer
    turn1 = turn_ids(tok, call("calculator", {"expression": "12*7"}))
    long_turn = turn_ids(tok, "The answer is 84, which I computed with the calculator tool. " * 3)
    client = scripted([turn1, long_turn])
    budget = len(turn1) + 20 + 10
    out = run_loop(tok, client, [CalculatorTool()], response_length=budget)
    assert len(out.response_ids) == budget
    inserted = len(context_segments(out)[0])
    assert client.calls[1]["max_tokens"] == budget - len(turn1) - inserted
    assert out.response_ids[-(budget - len(turn1) - inserted) :] == long_turn[: budget - len(turn1) - inserted]
    assert out.response_mask[-1] == 1


def test_max_assistant_turns_stops_before_running_the_call(smol_tokenizer, scripted, turn_ids):
    tok = smol_tokenizer
    turn1 = turn_ids(tok, call("calculator", {"expression": "1+1"}))
    out = run_loop(tok, scripted([turn1]), [CalculatorTool()], max_assistant_turns=1)
    assert out.response_ids == turn1 and out.tool_call_counts == 0 and out.num_turns == 2


def test_max_user_turns_stops_after_that_many_tool_turns(smol_tokenizer, scripted, turn_ids):
    tok = smol_tokenizer
    turn = turn_ids(tok, call("calculator", {"expression": "1+1"}))
    client = scripted([turn, turn, turn])
    out = run_loop(tok, client, [CalculatorTool()], max_user_turns=1)
    assert len(client.calls) == 2
    assert out.num_turns == 4 and out.tool_call_counts == 1
    assert out.response_mask[-1] == 1 and len(context_segments(out)) == 1


def test_a_turn_cut_by_the_client_ends_the_trajectory(smol_tokenizer, scripted, turn_ids):
    tok = smol_tokenizer
    turn = turn_ids(tok, call("calculator", {"expression": "1+1"}))
    client = scripted([turn, turn], stop_reasons=["aborted", "completed"])
    out = run_loop(tok, client, [CalculatorTool()])
    assert out.response_ids == turn and out.tool_call_counts == 0 and len(client.calls) == 1


def test_an_empty_last_turn_drops_the_tool_turn_before_it(smol_tokenizer, scripted, turn_ids):
    tok = smol_tokenizer
    turn1 = turn_ids(tok, call("calculator", {"expression": "1+1"}))
    out = run_loop(tok, scripted([turn1, []]), [CalculatorTool()])
    assert out.response_ids == turn1 and out.response_mask == [1] * len(turn1)
    assert out.num_turns == 3  # user + 2 assistant turns (one empty); the dropped tool turn is not counted


def test_tool_errors_go_back_to_the_model_as_tool_messages(smol_tokenizer, scripted, turn_ids):
    tok = smol_tokenizer

    @function_tool
    def explode(x: int) -> str:
        """Always fails."""
        raise RuntimeError(f"boom {x}")

    class Hang(BaseTool):
        def default_schema(self) -> dict[str, Any]:
            return {"type": "function", "function": {"name": "hang", "description": "never answers"}}

        async def execute(self, instance_id, parameters):
            await asyncio.Event().wait()

    bad_json = '<tool_call>\n{"name": "calculator", "arguments": "{not json"}\n</tool_call>'
    turn1 = turn_ids(
        tok,
        call("nope", {}) + bad_json + call("explode", {"x": 3}) + call("hang", {}) + "<tool_call>{oops</tool_call>",
    )
    turn2 = turn_ids(tok, "Sorry.")
    out = run_loop(
        tok, scripted([turn1, turn2]), [CalculatorTool(), explode, Hang()], max_parallel_calls=4, tool_timeout_s=0.05
    )
    text = tok.decode(context_segments(out)[0])
    assert "<|im_start|>tool\nError: unknown tool 'nope'; available tools: calculator, explode, hang<|im_end|>" in text
    assert "Error: the arguments of 'calculator' are not valid JSON" in text
    assert "Error: tool 'explode' failed: RuntimeError: boom 3" in text
    assert "Error: tool 'hang' did not finish within 0.05 s" in text
    assert "Error: 1 tool call(s) could not be read and were skipped: not valid JSON" in text
    assert out.tool_call_counts == 4
    assert out.metrics["tool_errors"] == 4 and out.metrics["tool_parse_errors"] == 1
    assert out.response_mask[-1] == 1 and out.num_turns == 4


def test_long_tool_output_is_truncated_by_characters(smol_tokenizer, scripted, turn_ids):
    tok = smol_tokenizer

    @function_tool
    def dump() -> str:
        """A lot of text."""
        return "a" * 50 + "b" * 50

    turn1 = turn_ids(tok, call("dump", {}))
    out = run_loop(
        tok, scripted([turn1, turn_ids(tok, "ok")]), [dump], max_tool_response_length=10, tool_response_truncate_side="left"
    )
    assert "tool\naaaaaaaaaa...(truncated)<|im_end|>" in tok.decode(context_segments(out)[0])


class Gate(BaseTool):
    """Counts concurrent calls; each call waits until ``wanted`` calls are inside at once."""

    def __init__(self, wanted: int) -> None:
        super().__init__()
        self.wanted = wanted
        self.active = 0
        self.max_active = 0
        self.calls = 0
        self.all_in = asyncio.Event()

    def default_schema(self) -> dict[str, Any]:
        return {"type": "function", "function": {"name": "gate", "description": "waits for company"}}

    async def execute(self, instance_id, parameters):
        self.calls += 1
        self.active += 1
        self.max_active = max(self.max_active, self.active)
        if self.active >= self.wanted:
            self.all_in.set()
        await self.all_in.wait()  # sequential calls would never get here: the loop's timeout fails them
        self.active -= 1
        return "in", 1.0, {}


@pytest.mark.parametrize("limit", [1, 2, 3])
def test_max_parallel_calls_run_together_and_the_rest_are_skipped(smol_tokenizer, scripted, turn_ids, limit):
    tok = smol_tokenizer
    gate = Gate(wanted=limit)
    turn1 = turn_ids(tok, call("gate", {}) * 5)
    out = run_loop(tok, scripted([turn1, turn_ids(tok, "ok")]), [gate], max_parallel_calls=limit, tool_timeout_s=5)
    assert gate.calls == limit and gate.max_active == limit
    assert out.tool_call_counts == limit and out.tool_rewards == [1.0] * limit
    text = tok.decode(context_segments(out)[0])
    assert text.count("<|im_start|>tool\nin<|im_end|>") == limit
    assert f"at most {limit} tool call(s) run per turn; the other {5 - limit} were skipped" in text


class Secret(BaseTool):
    """Per-trajectory state: ``create`` stores the row's secret, ``release`` forgets it."""

    def __init__(self) -> None:
        super().__init__()
        self.created: list[tuple[str, dict]] = []
        self.released: list[str] = []
        self.state: dict[str, str] = {}

    def default_schema(self) -> dict[str, Any]:
        return {"type": "function", "function": {"name": "secret", "description": "reveals the row's secret"}}

    async def create(self, instance_id, **kwargs):
        self.created.append((instance_id, kwargs))
        self.state[instance_id] = kwargs["code"]

    async def execute(self, instance_id, parameters):
        return self.state[instance_id], 0.5, {}

    async def release(self, instance_id):
        self.released.append(instance_id)
        del self.state[instance_id]


def test_tools_kwargs_create_one_instance_per_trajectory_and_release_it(smol_tokenizer, scripted, turn_ids):
    tok = smol_tokenizer
    tool = Secret()
    turn = turn_ids(tok, call("secret", {}))
    row = {"tools_kwargs": {"secret": {"create_kwargs": {"code": "XK-42"}}}}
    out = run_loop(tok, scripted([turn, turn, turn_ids(tok, "XK-42")]), [tool], row=row)
    assert len(tool.created) == 1 and tool.created[0][1] == {"code": "XK-42"}
    assert tool.released == [tool.created[0][0]] and tool.state == {}
    assert out.tool_rewards == [0.5, 0.5]
    assert all("XK-42" in tok.decode(s) for s in context_segments(out))


def test_tools_kwargs_naming_an_unknown_tool_warns_and_the_trajectory_completes(
    smol_tokenizer, scripted, turn_ids, caplog
):
    tok = smol_tokenizer
    row = {"tools_kwargs": {"not_a_tool_xyz": {"create_kwargs": {}}}}
    with caplog.at_level("WARNING"):
        out = run_loop(tok, scripted([turn_ids(tok, "fine")]), [CalculatorTool()], row=row)
    assert "not_a_tool_xyz" in caplog.text and "not configured" in caplog.text
    assert out.num_turns == 2


def test_calls_inside_thinking_are_not_run(smol_tokenizer, scripted, turn_ids):
    tok = smol_tokenizer
    turn = turn_ids(tok, "<think>maybe " + call("calculator", {"expression": "1+1"}) + "</think>The answer is 2.")
    client = scripted([turn])
    out = run_loop(tok, client, [CalculatorTool()])
    assert out.tool_call_counts == 0 and len(client.calls) == 1


def test_bad_loop_settings_are_refused(smol_tokenizer, scripted):
    context = AgentContext(client=scripted([]), tokenizer=smol_tokenizer, response_length=10)
    with pytest.raises(ValueError, match="max_parallel_calls"):
        ToolAgentLoop(context, max_parallel_calls=0)
    with pytest.raises(ValueError, match="tool_response_truncate_side"):
        ToolAgentLoop(context, tool_response_truncate_side="top")
    with pytest.raises(ValueError, match="unknown tool parser 'xml'"):
        ToolAgentLoop(context, format="xml")
