"""The built-in ``tool-lookup`` task: its data, its tool, its scorer, and that a worked SFT
conversation is token for token the trajectory the tool agent builds for the same turns."""

from __future__ import annotations

import asyncio
import json

import pytest
import yaml

from hybridflow import fields as F
from hybridflow.agent.base import AgentContext
from hybridflow.agent.tool_agent import ToolAgentLoop, tool_prompt_messages
from hybridflow.data.io import read_rows
from hybridflow.data.sft_dataset import SFTDataset
from hybridflow.data.tasks.tool_lookup import (
    DATA_SOURCE,
    LOOKUP_TOOL_SCHEMA,
    answer_text,
    generate_tool_lookup,
    tool_call_text,
)
from hybridflow.entrypoints.data import main as data_main
from hybridflow.inference.protocol import SamplingParams
from hybridflow.reward.scorers import default_compute_score
from hybridflow.tools.lookup import LookupTool
from hybridflow.tools.registry import build_tools


def test_splits_are_disjoint_and_each_answer_sits_in_its_rows_table():
    splits = generate_tool_lookup(40, 10, 8, seed=3, num_keys=4)
    assert [len(splits[s]) for s in ("train", "test", "sft")] == [40, 10, 8]
    codes = []
    for rows in splits.values():
        for row in rows:
            entries = row[F.EXTRA_INFO]["tools_kwargs"]["lookup"]["create_kwargs"]["entries"]
            table = {e["key"]: e["code"] for e in entries}
            assert len(table) == 4
            key = row[F.EXTRA_INFO]["key"]
            assert f"'{key}'" in row["prompt"][0]["content"]
            assert table[key] == row[F.REWARD_MODEL]["ground_truth"]
            assert row[F.DATA_SOURCE] == DATA_SOURCE
            codes += list(table.values())
    assert len(codes) == len(set(codes)), "a code is reused across rows or splits"
    assert generate_tool_lookup(40, 10, 8, seed=3, num_keys=4) == splits  # deterministic
    assert generate_tool_lookup(40, 10, 8, seed=4, num_keys=4) != splits


def test_sft_rows_are_worked_tool_conversations():
    row = generate_tool_lookup(0, 0, 1, seed=0)["sft"][0]
    key, code = row[F.EXTRA_INFO]["key"], row[F.REWARD_MODEL]["ground_truth"]
    assert [m["role"] for m in row["messages"]] == ["user", "assistant", "tool", "assistant"]
    assert row["messages"][1]["content"] == tool_call_text(key)
    assert json.loads(row["messages"][1]["content"].split("\n")[1]) == {"name": "lookup", "arguments": {"key": key}}
    assert row["messages"][2]["content"] == code
    assert row["messages"][3]["content"] == answer_text(code) == f"The code is {code}.\n#### {code}"
    assert row["tools"] == [LOOKUP_TOOL_SCHEMA]


def test_data_command_writes_the_splits_and_a_tool_config_that_loads(tmp_path, capsys):
    assert data_main(["tool-lookup", "--out", str(tmp_path), "--train-size", "6", "--test-size", "2", "--sft-size", "3"]) == 0
    names = {p.name for p in tmp_path.iterdir()}
    assert names == {f"{s}{x}" for s in ("train", "test", "sft") for x in (".parquet", ".jsonl")} | {"tools.yaml"}
    assert len(read_rows(tmp_path / "sft.parquet")) == 3 and len(read_rows(tmp_path / "train.parquet")) == 6
    tools = build_tools(tool_config_path=str(tmp_path / "tools.yaml"))
    assert list(tools) == ["lookup"] and isinstance(tools["lookup"], LookupTool)
    assert tools["lookup"].schema == LOOKUP_TOOL_SCHEMA
    assert yaml.safe_load((tmp_path / "tools.yaml").read_text())["tools"][0]["tool_schema"] == LOOKUP_TOOL_SCHEMA


def test_lookup_tool_answers_from_the_trajectory_table_only():
    tool = LookupTool()

    async def scenario():
        await tool.create("a", entries=[{"key": "amber", "code": "12345"}, {"key": "birch", "code": "67890"}])
        await tool.create("b", entries=[{"key": "amber", "code": "55555"}])
        found = await tool.execute("a", {"key": " amber "})
        other = await tool.execute("b", {"key": "amber"})
        missing = await tool.execute("b", {"key": "birch"})
        await tool.release("a")
        after = await tool.execute("a", {"key": "amber"})
        with pytest.raises(ValueError, match="missing required argument: key"):
            await tool.execute("b", {})
        with pytest.raises(ValueError, match="'key' and 'code'"):
            await tool.create("c", entries=[{"key": "x"}])
        return found, other, missing, after

    found, other, missing, after = asyncio.run(scenario())
    assert found == ("12345", 0.0, {"found": 1.0})
    assert other[0] == "55555"
    assert missing[0] == "no code is stored under 'birch'" and missing[2] == {"found": 0.0}
    assert after[0] == "no code is stored under 'amber'"


@pytest.mark.parametrize(
    ("response", "score", "formatted"),
    [
        ("The code is 48213.\n#### 48213", 1.0, 1.0),
        ("####48213", 1.0, 1.0),
        ("#### 48213 and later #### 11111", 0.0, 1.0),  # the last marked answer counts
        ("#### 48214", 0.0, 1.0),
        # the tool's output alone (the code, unmarked) in the decoded trajectory is not an answer
        ('<tool_call>\n{"name": "lookup"}\n</tool_call>\n<|im_start|>tool\n48213<|im_end|>', 0.0, 0.0),
        ("", 0.0, 0.0),
    ],
)
def test_scorer_needs_the_marked_code(response, score, formatted):
    result = default_compute_score(DATA_SOURCE, response, "48213")
    assert result["score"] == result["acc"] == score
    assert result["formatted"] == formatted


@pytest.mark.parametrize("template", ["smol_tokenizer", "qwen_tokenizer"])
def test_sft_example_is_the_agent_trajectory_token_for_token(template, request, tmp_path, scripted, turn_ids):
    """The warm start trains on exactly the tokens the tool agent later builds: the same
    prompt (tools described the same way), the same inserted tool turn, and loss on exactly
    the model's turns."""
    tok = request.getfixturevalue(template)
    row = generate_tool_lookup(0, 0, 1, seed=5)["sft"][0]
    (tmp_path / "sft.jsonl").write_text(json.dumps(row) + "\n")
    dataset = SFTDataset(
        tmp_path / "sft.jsonl", tok, messages_key="messages", tools_key="tools", max_length=2048,
        tool_prompt=lambda messages, tools: tool_prompt_messages(tok, messages, tools),
    )
    sft_ids, sft_mask = dataset.token_ids(0)

    key, code = row[F.EXTRA_INFO]["key"], row[F.REWARD_MODEL]["ground_truth"]
    client = scripted([turn_ids(tok, tool_call_text(key)), turn_ids(tok, answer_text(code))])
    tool = LookupTool()
    context = AgentContext(client=client, tokenizer=tok, response_length=2048, tools={tool.name: tool})
    out = asyncio.run(
        ToolAgentLoop(context).run(
            SamplingParams(temperature=0.0), raw_prompt=row["prompt"], tools_kwargs=row[F.EXTRA_INFO]["tools_kwargs"]
        )
    )
    assert out.tool_call_counts == 1
    agent_ids = out.prompt_ids + out.response_ids
    # SFT ends with the template's text after the last turn (ChatML's "\n"); the agent stops at <|im_end|>
    assert sft_ids[: len(agent_ids)] == agent_ids
    assert all(m == 0 for m in sft_mask[len(agent_ids) :])
    assert sft_mask[len(out.prompt_ids) : len(agent_ids)] == out.response_mask
    assert not any(sft_mask[: len(out.prompt_ids)])
    assert tok.decode(out.response_ids).count(code) == 3  # tool result, then twice in the answer


def test_sft_tools_column_errors_name_the_row(tmp_path, smol_tokenizer):
    rows = [
        {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}], "tools": "{not json"},
    ]
    (tmp_path / "bad.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    with pytest.raises(Exception, match=r"row 0: field 'tools': not valid JSON"):
        SFTDataset(tmp_path / "bad.jsonl", smol_tokenizer, messages_key="messages", tools_key="tools")
    (tmp_path / "bad2.jsonl").write_text(json.dumps({**rows[0], "tools": [1, 2]}) + "\n")
    with pytest.raises(Exception, match=r"row 0: field 'tools': expected a list of tool schemas"):
        SFTDataset(tmp_path / "bad2.jsonl", smol_tokenizer, messages_key="messages", tools_key="tools")


def test_sft_without_tool_prompt_passes_tools_to_a_template_that_renders_them(tmp_path, qwen_tokenizer):
    row = generate_tool_lookup(0, 0, 1, seed=1)["sft"][0]
    (tmp_path / "sft.jsonl").write_text(json.dumps(row) + "\n")
    with_tools = SFTDataset(tmp_path / "sft.jsonl", qwen_tokenizer, messages_key="messages", tools_key="tools", max_length=4096)
    without = SFTDataset(tmp_path / "sft.jsonl", qwen_tokenizer, messages_key="messages", tools_key=None, max_length=4096)
    text = qwen_tokenizer.decode(with_tools.token_ids(0)[0])
    assert '"name": "lookup"' in text and "# Tools" in text
    assert "# Tools" not in qwen_tokenizer.decode(without.token_ids(0)[0])


def test_a_split_does_not_depend_on_the_other_splits_sizes():
    small, large = generate_tool_lookup(10, 5, 4, seed=2), generate_tool_lookup(50, 5, 4, seed=2)
    assert small["test"] == large["test"] and small["sft"] == large["sft"]
    assert large["train"][:10] == small["train"]
