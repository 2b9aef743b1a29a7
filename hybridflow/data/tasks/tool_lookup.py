"""Built-in task ``tool-lookup``: an answer the model can only get by calling a tool.

Each row asks for the code stored under a key (``"What is the code stored under the key
'amber'? ..."``). The code is a random 5-digit number drawn for that row, so it cannot be
guessed or memorised (a guess is right with probability 1/90000); the row's own table — the
asked key and a few distractor keys, each with a random code — is reachable only through the
``lookup(key)`` tool (:class:`hybridflow.tools.lookup.LookupTool`), which gets the table through
the row's ``tools_kwargs`` (verl's layout, in ``extra_info``). The reward (scoring, below) is 1
when the number after the last ``####`` in the response is the code.

Files written by ``hybridflow data tool-lookup --out DIR``:

* ``train`` / ``test`` — the RL split and its held-out problems (distinct tables, distinct codes);
* ``sft`` — worked tool conversations for a warm start, in a ``messages`` column with the tool
  schemas in a ``tools`` column (verl's multi-turn SFT layout)::

      user:      What is the code stored under the key 'amber'? ...
      assistant: <tool_call>\\n{"name": "lookup", "arguments": {"key": "amber"}}\\n</tool_call>
      tool:      48213
      assistant: The code is 48213.\\n#### 48213

* ``tools.yaml`` — the tool config for ``actor_rollout_ref.rollout.multi_turn.tool_config_path``.

The SFT rows use their own tables and codes, never those of the RL or test rows.

Scoring (:func:`compute_score`, the reward of ``hybridflow/tool-lookup`` rows): 1.0 when the
number after the last ``####`` in the response is the row's code (as a string of digits:
``#### 48213``), else 0.0. Strict on purpose: the tool's own output (the bare code) sits in the
decoded response of an agent trajectory, so a lenient "last number" rule would reward a model
that called the tool but never answered. ``formatted`` is 1.0 when a ``####`` answer was given
at all.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path
from typing import Any

import yaml

from hybridflow import fields as F
from hybridflow.data.io import write_rows
from hybridflow.data.tasks.answers import marked_answer
from hybridflow.data.tasks.common import Rows, TaskSpec, add_size_arguments, make_row

DATA_SOURCE = "hybridflow/tool-lookup"
TOOL_NAME = "lookup"
TOOL_CLASS = "hybridflow.tools.lookup.LookupTool"
SFT_SPLIT = "sft"
TOOL_CONFIG_FILE = "tools.yaml"
CODE_RANGE = (10000, 99999)
KEYS: tuple[str, ...] = (
    "amber", "birch", "cedar", "delta", "ember", "fjord", "glade", "harbor", "iris", "jade",
    "kestrel", "lotus", "maple", "nectar", "onyx", "pepper", "quartz", "raven", "sable", "thistle",
    "umber", "violet", "willow", "yarrow", "zephyr", "basil", "coral", "dune", "flint", "garnet",
    "hazel", "indigo", "juniper", "lilac", "marble", "nova", "olive", "pine", "saffron", "tide",
)  # fmt: skip
DEFAULT_INSTRUCTION = "Use the lookup tool, then write the code after '####'."

# The single source of the tool's description: the LookupTool's default schema, the SFT rows'
# ``tools`` column and the written tools.yaml all use this dict.
LOOKUP_TOOL_SCHEMA: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": TOOL_NAME,
        "description": "Look up the code stored under a key.",
        "parameters": {
            "type": "object",
            "properties": {"key": {"type": "string", "description": "the key, e.g. amber"}},
            "required": ["key"],
        },
    },
}


def tool_call_text(key: str) -> str:
    """The assistant turn that calls the tool, in the hermes format."""
    call = json.dumps({"name": TOOL_NAME, "arguments": {"key": key}})
    return f"<tool_call>\n{call}\n</tool_call>"


def answer_text(code: str) -> str:
    """The assistant turn after the tool result."""
    return f"The code is {code}.\n#### {code}"


def _problem(rng: random.Random, num_keys: int, taken_codes: set[str]) -> tuple[str, list[dict[str, str]]]:
    """``(asked key, table entries)``: ``num_keys`` distinct keys, each with a fresh code."""
    keys = rng.sample(KEYS, num_keys)
    entries = []
    for key in keys:
        while True:
            code = str(rng.randint(*CODE_RANGE))
            if code not in taken_codes:
                taken_codes.add(code)
                break
        entries.append({"key": key, "code": code})
    asked = rng.choice(keys)
    return asked, entries


def generate_tool_lookup(
    num_train: int,
    num_test: int,
    num_sft: int,
    *,
    seed: int = 0,
    num_keys: int = 3,
    instruction: str = DEFAULT_INSTRUCTION,
) -> dict[str, Rows]:
    """``{"train", "test", "sft"}`` rows; every code occurs in exactly one row of one split."""
    if not 1 <= num_keys <= len(KEYS):
        raise ValueError(f"num_keys must be in 1..{len(KEYS)}, got {num_keys}")
    if min(num_train, num_test, num_sft) < 0:
        raise ValueError(f"sizes must be >= 0, got train={num_train} test={num_test} sft={num_sft}")
    if num_train + num_test + num_sft > (CODE_RANGE[1] - CODE_RANGE[0]) // (10 * num_keys):
        raise ValueError("too many rows for distinct codes; ask for fewer rows or keys")
    taken: set[str] = set()
    splits: dict[str, Rows] = {}
    for split, count in (("test", num_test), ("train", num_train), (SFT_SPLIT, num_sft)):
        rng = random.Random(f"{seed}/{split}")  # a split's rows do not depend on the other splits' sizes
        rows = []
        for index in range(count):
            asked, entries = _problem(rng, num_keys, taken)
            rows.append(_row(asked, entries, split, index, instruction))
        splits[split] = rows
    splits[SFT_SPLIT] = [_with_conversation(row) for row in splits[SFT_SPLIT]]
    return splits


def _row(asked: str, entries: list[dict[str, str]], split: str, index: int, instruction: str) -> dict[str, Any]:
    code = next(e["code"] for e in entries if e["key"] == asked)
    question = f"What is the code stored under the key '{asked}'? {instruction}".strip()
    return make_row(
        data_source=DATA_SOURCE,
        question=question,
        ground_truth=code,
        split=split,
        index=index,
        ability="tool-use",
        extra={"key": asked, "tools_kwargs": {TOOL_NAME: {"create_kwargs": {"entries": entries}}}},
    )


def _with_conversation(row: dict[str, Any]) -> dict[str, Any]:
    key, code = row[F.EXTRA_INFO]["key"], row[F.REWARD_MODEL]["ground_truth"]
    messages = [
        *row["prompt"],
        {"role": "assistant", "content": tool_call_text(key)},
        {"role": "tool", "content": code},
        {"role": "assistant", "content": answer_text(code)},
    ]
    return {**row, "messages": messages, "tools": [LOOKUP_TOOL_SCHEMA]}


def tool_config() -> dict[str, Any]:
    """The ``tools.yaml`` content: the lookup tool with its schema."""
    return {"tools": [{"class_name": TOOL_CLASS, "config": {"type": "native"}, "tool_schema": LOOKUP_TOOL_SCHEMA}]}


def _add_arguments(parser: argparse.ArgumentParser) -> None:
    add_size_arguments(parser, train_size=256, test_size=64)
    parser.add_argument("--sft-size", type=int, default=64, help="worked tool conversations for SFT (default 64)")
    parser.add_argument("--num-keys", type=int, default=3, help="keys in each row's table (default 3)")
    parser.add_argument("--instruction", default=DEFAULT_INSTRUCTION, help="text appended to every question")


def _splits(args: argparse.Namespace) -> dict[str, Rows]:
    return generate_tool_lookup(
        args.train_size,
        args.test_size,
        args.sft_size,
        seed=args.seed,
        num_keys=args.num_keys,
        instruction=args.instruction,
    )


def _build(args: argparse.Namespace) -> tuple[Rows, Rows]:
    splits = _splits(args)
    return splits["train"], splits["test"]


def _write_extra(args: argparse.Namespace, out_dir: Path) -> list[Path]:
    sft = _splits(args)[SFT_SPLIT]  # the generator is deterministic: the same rows as _build's run
    written = [write_rows(sft, out_dir / f"{SFT_SPLIT}{suffix}") for suffix in (".parquet", ".jsonl")]
    config_path = out_dir / TOOL_CONFIG_FILE
    config_path.write_text(yaml.safe_dump(tool_config(), sort_keys=False))
    return [*written, config_path]


TASK = TaskSpec(
    name="tool-lookup",
    help="find a random code only a lookup(key) tool knows; RL split, test split, SFT tool conversations, tools.yaml",
    add_arguments=_add_arguments,
    build=_build,
    write_extra=_write_extra,
)


# --- scoring: the reward of DATA_SOURCE rows (registered in hybridflow/reward/scorers/__init__.py) ---
def compute_score(solution_str: str, ground_truth: Any, extra_info: dict | None = None) -> dict[str, float | str]:
    """``{"score": 1.0 | 0.0, "acc": same, "formatted": 1.0 | 0.0, "pred": the answer or ""}``."""
    answer = marked_answer(solution_str)
    correct = 1.0 if answer is not None and answer.strip() == str(ground_truth).strip() else 0.0
    return {"score": correct, "acc": correct, "formatted": 0.0 if answer is None else 1.0, "pred": answer or ""}
