"""The loop table (built-ins + verl's agent_loop_config_path YAML), single_turn_agent, and the
batch runner that picks a loop per row by ``agent_name``."""

from __future__ import annotations

import asyncio
import textwrap

import numpy as np
import pytest
import torch

from hybridflow import fields as F
from hybridflow.agent.base import (
    AGENT_LOOPS,
    AgentContext,
    AgentLoopConfigError,
    agent_loop_table,
    load_agent_loop_config,
)
from hybridflow.agent.runner import run_agent_loops
from hybridflow.agent.single_turn import SingleTurnAgentLoop
from hybridflow.agent.tokens import render_ids
from hybridflow.agent.tool_agent import ToolAgentLoop
from hybridflow.inference.protocol import SamplingParams
from hybridflow.protocol import DataProto
from hybridflow.tools.calculator import CalculatorTool

GREEDY = SamplingParams(temperature=0.0)

CUSTOM_LOOP = '''
from hybridflow.agent.base import AgentLoopBase, AgentLoopOutput


class EchoLoop(AgentLoopBase):
    """Answers with `repeat` copies of the prompt's last token, without calling the model."""

    def __init__(self, context, repeat=1, label="echo"):
        super().__init__(context)
        self.repeat = repeat
        self.label = label

    async def run(self, sampling, **row):
        ids = list(row["raw_prompt_ids"])
        response = [ids[-1]] * self.repeat
        return AgentLoopOutput(ids, response, [1] * len(response), [-1.0] * len(response), num_turns=2)


class NotALoop:
    pass
'''


@pytest.fixture
def loop_module(tmp_path, monkeypatch):
    (tmp_path / "my_loops_for_test.py").write_text(CUSTOM_LOOP)
    monkeypatch.syspath_prepend(str(tmp_path))
    return "my_loops_for_test"


def write(tmp_path, text: str):
    path = tmp_path / "agent_loops.yaml"
    path.write_text(textwrap.dedent(text))
    return path


def test_builtins_are_registered():
    assert AGENT_LOOPS.get("single_turn_agent") is SingleTurnAgentLoop
    assert AGENT_LOOPS.get("tool_agent") is ToolAgentLoop


def test_yaml_entries_load_with_their_kwargs(tmp_path, loop_module):
    path = write(tmp_path, f"""
        - name: echo3
          _target_: {loop_module}.EchoLoop
          repeat: 3
        - name: echo_default
          _target_: {loop_module}.EchoLoop
    """)
    specs = load_agent_loop_config(path)
    assert [(s.name, s.cls.__name__, dict(s.kwargs)) for s in specs] == [
        ("echo3", "EchoLoop", {"repeat": 3}),
        ("echo_default", "EchoLoop", {}),
    ]
    table = agent_loop_table(path, builtin_kwargs={"tool_agent": {"max_parallel_calls": 2}})
    assert table.names() == ["echo3", "echo_default", "single_turn_agent", "tool_agent"]
    assert table.get("tool_agent").kwargs == {"max_parallel_calls": 2}


@pytest.mark.parametrize(
    ("entries", "message"),
    [
        ("- name: tool_agent\n  _target_: {m}.EchoLoop\n", "'tool_agent' is already taken by hybridflow.agent.tool_agent.ToolAgentLoop"),
        ("- name: a\n  _target_: {m}.EchoLoop\n- name: a\n  _target_: {m}.EchoLoop\n", "'a' appears twice"),
        ("- name: a\n  _target_: {m}.Missing\n", "has no attribute 'Missing'"),
        ("- name: a\n  _target_: no_such_module_xyz.Loop\n", "cannot import module 'no_such_module_xyz'"),
        ("- name: a\n  _target_: {m}.NotALoop\n", "not a subclass of hybridflow.agent.base.AgentLoopBase"),
        ("- name: a\n  _target_: {m}.EchoLoop\n  repeats: 2\n", "does not accept these arguments"),
        ("- _target_: {m}.EchoLoop\n", "'name' is missing"),
        ("- name: a\n", "'_target_'"),
        ("name: a\n", "a YAML list"),
    ],
)
def test_bad_yaml_entries_fail_at_start_up_with_the_file_named(tmp_path, loop_module, entries, message):
    path = write(tmp_path, entries.format(m=loop_module))
    with pytest.raises(AgentLoopConfigError, match=message) as info:
        agent_loop_table(path)
    assert str(path) in str(info.value)


def test_a_missing_yaml_file_is_a_file_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="agent_loop_config_path"):
        agent_loop_table(tmp_path / "nope.yaml")


def test_single_turn_uses_the_datasets_prompt_ids(smol_tokenizer, scripted, turn_ids):
    tok = smol_tokenizer
    turn = turn_ids(tok, "Twelve.")
    client = scripted([turn])
    context = AgentContext(client=client, tokenizer=tok, response_length=64)
    out = asyncio.run(SingleTurnAgentLoop(context).run(GREEDY, raw_prompt_ids=[5, 6, 7], raw_prompt=[{"role": "user", "content": "x"}]))
    assert client.calls[0]["prompt_ids"] == [5, 6, 7] and client.calls[0]["max_tokens"] == 64
    assert out.prompt_ids == [5, 6, 7] and out.response_ids == turn and out.response_mask == [1] * len(turn)
    assert out.response_log_probs == [client.log_prob(0, j) for j in range(len(turn))]
    assert out.num_turns == 2 and out.tool_call_counts == 0


def test_single_turn_renders_raw_prompt_as_the_dataset_does(smol_tokenizer, scripted, turn_ids):
    tok = smol_tokenizer
    messages = np.array([{"role": "user", "content": "What is 7 + 5?"}], dtype=object)  # as read from parquet
    client = scripted([turn_ids(tok, "12")])
    context = AgentContext(client=client, tokenizer=tok, response_length=8)
    out = asyncio.run(SingleTurnAgentLoop(context).run(GREEDY, raw_prompt=messages))
    text = tok.apply_chat_template(list(messages), add_generation_prompt=True, tokenize=False)
    assert out.prompt_ids == tok(text, add_special_tokens=False)["input_ids"]
    assert out.prompt_ids == render_ids(tok, list(messages), add_generation_prompt=True)


def test_single_turn_without_a_prompt_says_what_it_needs(smol_tokenizer, scripted):
    context = AgentContext(client=scripted([]), tokenizer=smol_tokenizer, response_length=8)
    with pytest.raises(ValueError, match="raw_prompt"):
        asyncio.run(SingleTurnAgentLoop(context).run(GREEDY))


def _prompt_batch(rows: list[list[int]], pad: int, **non_tensors) -> DataProto:
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, width - len(r) :] = torch.tensor(r)
        mask[i, width - len(r) :] = 1
    positions = torch.clamp(mask.cumsum(1) - 1, min=0)
    return DataProto.from_dict(
        tensors={F.INPUT_IDS: ids, F.ATTENTION_MASK: mask, F.POSITION_IDS: positions},
        non_tensors=non_tensors,
        meta_info={"validate": False},
    )


def test_runner_picks_each_rows_loop_and_collates_in_row_order(smol_tokenizer, scripted, turn_ids, tmp_path, loop_module):
    tok = smol_tokenizer
    path = write(tmp_path, f"- name: echo\n  _target_: {loop_module}.EchoLoop\n  repeat: 2\n")
    table = agent_loop_table(path)
    answer = turn_ids(tok, "ok")
    call = turn_ids(tok, '<tool_call>{"name": "calculator", "arguments": {"expression": "2*3"}}</tool_call>')
    # one client serves every trajectory; the tool trajectory asks twice
    client = scripted([answer, call, answer])
    raw = [{"role": "user", "content": "Compute 2*3"}]
    prompts = _prompt_batch(
        [[41, 42], [43, 44, 45], [46]],
        pad=tok.pad_token_id,
        agent_name=np.array([None, "echo", "tool_agent"], dtype=object),
        raw_prompt=np.array([raw, raw, raw], dtype=object),
        uid=np.array(["a", "b", "c"], dtype=object),
    )
    context = AgentContext(client=client, tokenizer=tok, response_length=300, tools={"calculator": CalculatorTool()})
    out = asyncio.run(
        run_agent_loops(prompts, table=table, context=context, sampling=GREEDY, prompt_length=700, pad_token_id=tok.pad_token_id)
    )
    assert len(out) == 3
    responses, mask = out.batch[F.RESPONSES], out.batch[F.RESPONSE_MASK]
    # row 0: the default loop (single turn) on the batch's own prompt ids
    assert out.batch[F.PROMPTS][0, -2:].tolist() == [41, 42]
    assert responses[0, : len(answer)].tolist() == answer and mask[0].sum() == len(answer)
    # row 1: the YAML loop with its kwargs
    assert responses[1, :2].tolist() == [45, 45] and mask[1].sum() == 2
    # row 2: the tool loop, with a tool turn in the middle
    assert out.non_tensor_batch["__num_turns__"].tolist() == [2, 2, 4]
    assert out.non_tensor_batch["tool_call_counts"].tolist() == [0, 0, 1]
    assert "<|im_start|>tool\n6<|im_end|>" in tok.decode(responses[2][(mask[2] == 0) & (out.batch[F.ATTENTION_MASK][2, 700:] == 1)])
    assert out.non_tensor_batch["uid"].tolist() == ["a", "b", "c"]
    assert out.meta_info["validate"] is False and "num_turns/mean" in out.meta_info["metrics"]


def test_runner_refuses_an_unknown_agent_name_before_running_anything(smol_tokenizer, scripted):
    client = scripted([])
    prompts = _prompt_batch([[1, 2]], pad=0, agent_name=np.array(["nope"], dtype=object))
    context = AgentContext(client=client, tokenizer=smol_tokenizer, response_length=8)
    with pytest.raises(ValueError, match="unknown agent loop 'nope'; valid names: single_turn_agent, tool_agent"):
        asyncio.run(run_agent_loops(prompts, table=agent_loop_table(), context=context, sampling=GREEDY, prompt_length=4, pad_token_id=0))
    assert client.calls == []
