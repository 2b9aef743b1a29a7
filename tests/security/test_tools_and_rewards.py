"""Hostile input to tools, tool configs and reward functions (issue 28).

A corpus: each test's docstring names the attack and the refusal expected. Extend it when a
feature adds a new way for a model, a data row or a config file to reach tools, sandboxes or
rewards. Everything here is in-process and deterministic; the wall-clock bounds are generous
(several times what the refusal takes) because they only have to tell milliseconds from the
seconds to minutes an attack costs.

Only APIs that existed before the fixes are imported at module level, so that on the old code
each test fails on its own assertion rather than the whole module on an import.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from typing import Any

import numpy as np
import pytest
import torch

from hybridflow.agent.base import AgentContext
from hybridflow.agent.tool_agent import ToolAgentLoop
from hybridflow.inference.protocol import SamplingParams, TokenOutput
from hybridflow.protocol import DataProto
from hybridflow.reward import reward_fault_metrics
from hybridflow.reward.base import RewardManager
from hybridflow.reward.batch import BatchRewardManager
from hybridflow.sandbox import isolation
from hybridflow.sandbox.client import LocalSandbox
from hybridflow.sandbox.limits import SandboxLimits
from hybridflow.tools.base import BaseTool
from hybridflow.tools.calculator import CalculatorTool, evaluate
from hybridflow.tools.calls import ToolSession
from hybridflow.tools.python import PythonTool
from hybridflow.tools.registry import ToolConfigError, load_tool_config


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    """The tiny byte-level tokenizer with a ChatML template (imported here: transformers is slow
    to import, and most tests need no tokenizer)."""
    from hybridflow.models.tiny import build_tiny_tokenizer

    tok = build_tiny_tokenizer()
    tok.chat_template = TEMPLATE
    return tok


TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

# ---------------------------------------------------------------- 1. tools bounded in time

ROUND_ATTACK = "round(7, -30000000)"  # Python builds 10**30000000 for it: ~33 s of one core


def call_tool(tool: BaseTool, arguments: dict[str, Any], timeout_s: float = 60.0) -> tuple[str, float, bool]:
    """(text for the model, seconds taken, error flag) of one call through the agent's session."""
    session = ToolSession({tool.name: tool}, trajectory_id="probe", timeout_s=timeout_s, max_tool_response_length=500)
    start = time.perf_counter()
    result = asyncio.run(session.call(tool.name, arguments))
    return result.text, time.perf_counter() - start, result.error


def test_calculator_refuses_round_with_a_huge_negative_ndigits_before_computing():
    """Attack: ``calculator(round(7, -30000000))`` — a 19-character expression whose evaluation
    builds a 30-million-digit integer, ~33 s of pure C arithmetic that no timer can interrupt.
    Expected: refused from ``ndigits`` alone, in milliseconds, as an error the model reads."""
    text, elapsed, error = call_tool(CalculatorTool(), {"expression": ROUND_ATTACK})
    assert error
    assert text == (
        "Error: tool 'calculator' failed: ValueError: round()'s ndigits must be between -1000 and 1000, got -30000000"
    )
    assert elapsed < 5, f"the refusal took {elapsed:.1f} s"


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ("10**999 * 10**999", "would have more than 1000 digits"),  # refused from the operands' sizes
        ("(10**999 * 9) * (10**999 * 9)", "would have more than 1000 digits"),
        ("round(7.5, 10**9)", "ndigits must be between -1000 and 1000"),
        ("round(7, 2.5)", "ndigits must be a whole number, got 2.5"),
        ("sqrt(10**400)", "sqrt\\(\\): the argument is too large"),
        ("abs(10**999 * 10)", "more than 1000 digits"),
        ("max(1, 9**9**9)", "exponent 387420489 is larger than 1000"),
        ("10**999 // 10**-999", "too large"),
        ("(10**999) ** -1", "too large"),
        ("10**999 % 1e-300", "too large"),
        ("1e999", "not finite"),
        ("-" * 499 + "1", None),  # deep but cheap: accepted
    ],
)
def test_calculator_bounds_every_big_number_path(expression, message):
    """Attack: big-integer work hidden in products, functions, ``//``/``%`` or literals instead
    of ``**``. Expected: refused with a message naming the limit (or, for cheap input,
    answered), each in well under a second."""
    start = time.perf_counter()
    if message is None:
        assert evaluate(expression) == -1
    else:
        with pytest.raises(ValueError, match=message):
            evaluate(expression)
    assert time.perf_counter() - start < 1


def test_calculator_worst_accepted_expressions_take_milliseconds():
    """Attack: the most work the limits still let through — powers, products and rounds of
    numbers near 1000 digits, chained up to the 500-character limit. Expected: exact answers,
    all four within a second."""
    cases = {
        "round(7, -1000) + round(10**999, -999) + 99**500 // 7**800 % 3**600": 10**999 + 99**500 // 7**800 % 3**600,
        " + ".join(["(9**1000 - 1) // 4"] * 8): 8 * ((9**1000 - 1) // 4),
        "*".join(["(10**40)"] * 24): 10**960,
        "min(" + ", ".join(["2**999"] * 55) + ", 3)": 3,
    }
    start = time.perf_counter()
    for expression, value in cases.items():
        assert len(expression) <= 500
        assert evaluate(expression) == value
    assert time.perf_counter() - start < 1


SLEEP_S = 5.0


class LoopBlocker(BaseTool):
    """A tool whose ``async def execute`` never awaits: it blocks whatever loop runs it."""

    def default_schema(self) -> dict[str, Any]:
        return {"type": "function", "function": {"name": "blocker", "description": "sleeps without awaiting"}}

    async def execute(self, instance_id: str, parameters: dict[str, Any]) -> tuple[str, float, dict]:
        time.sleep(SLEEP_S)  # noqa: ASYNC251 - deliberately synchronous: the attack
        return "slept", 0.0, {}


def test_a_tool_that_blocks_the_event_loop_is_cut_at_the_timeout():
    """Attack: a tool that blocks its event loop (``time.sleep`` in ``async def execute``), so
    ``asyncio.wait_for``'s timer cannot fire until it returns. Expected: the call is an error
    at ``timeout_s`` (0.3 s), not after the 5 s sleep; the caller's loop keeps running
    meanwhile; and the next call, of another tool, is answered at once."""

    async def scenario() -> tuple[list[str], str, float, str, float]:
        session = ToolSession(
            {"blocker": LoopBlocker(), "calculator": CalculatorTool()}, trajectory_id="probe", timeout_s=0.3
        )
        events: list[str] = []

        async def ticker() -> None:
            await asyncio.sleep(0.05)
            events.append("the caller's loop ran")

        async def blocked() -> tuple[str, float]:
            start = time.perf_counter()
            result = await session.call("blocker", {})
            events.append("the blocking call returned")
            return result.text, time.perf_counter() - start

        _, (text, elapsed) = await asyncio.gather(ticker(), blocked())
        start = time.perf_counter()
        after = await session.call("calculator", {"expression": "6*7"})
        return events, text, elapsed, after.text, time.perf_counter() - start

    events, text, elapsed, after, after_elapsed = asyncio.run(scenario())
    assert text == "Error: tool 'blocker' did not finish within 0.3 s"
    assert elapsed < 2.5, f"the call took {elapsed:.1f} s: the timeout waited for the sleep"
    assert events == ["the caller's loop ran", "the blocking call returned"]
    assert after == "42" and after_elapsed < 1.5


class TwoTurns:
    """A token client whose model calls ``blocker`` and then says ``ok``."""

    def __init__(self, tokenizer: Any) -> None:
        call = '<tool_call>\n{"name": "blocker", "arguments": {}}\n</tool_call>'
        self.turns = [tokenizer.encode(text, add_special_tokens=False) + [tokenizer.eos_token_id] for text in (call, "ok")]

    async def generate(self, request_id: str, prompt_ids: list[int], sampling: SamplingParams, max_tokens: int) -> TokenOutput:
        ids = self.turns.pop(0)
        return TokenOutput(token_ids=ids, log_probs=[-1.0] * len(ids), stop_reason="completed", weight_version=0)


def test_the_agent_loop_does_not_wait_for_a_tool_that_blocks(tokenizer):
    """Attack: the same loop-blocking tool, called by a model inside ``tool_agent``.
    Expected: the trajectory completes right after ``tool_timeout_s``, the model reads the
    timeout error and answers; the step does not wait out the sleep."""
    context = AgentContext(client=TwoTurns(tokenizer), tokenizer=tokenizer, response_length=1000,
                           tools={"blocker": LoopBlocker()})
    loop = ToolAgentLoop(context, tool_timeout_s=0.3)
    start = time.perf_counter()
    out = asyncio.run(loop.run(SamplingParams(temperature=0.0), raw_prompt=[{"role": "user", "content": "go"}]))
    elapsed = time.perf_counter() - start
    inserted = tokenizer.decode([t for t, m in zip(out.response_ids, out.response_mask, strict=True) if m == 0])
    assert "Error: tool 'blocker' did not finish within 0.3 s" in inserted
    assert out.metrics["tool_errors"] == 1 and out.num_turns == 4
    assert elapsed < 2.5, f"the trajectory took {elapsed:.1f} s: the agent loop waited for the sleep"


class Quitter(BaseTool):
    def default_schema(self) -> dict[str, Any]:
        return {"type": "function", "function": {"name": "quitter", "description": "exits"}}

    async def execute(self, instance_id: str, parameters: dict[str, Any]) -> tuple[str, float, dict]:
        raise SystemExit(3)


def test_a_tool_that_exits_fails_its_call_only():
    """Attack: ``sys.exit()`` inside ``async def execute`` (SystemExit is no ``Exception``, so
    it passed every handler and ended the step). Expected: that call is an error for the model,
    and the next call is served as usual."""
    text, _, error = call_tool(Quitter(), {})
    assert error and text == "Error: tool 'quitter' failed: RuntimeError: SystemExit: 3"
    assert call_tool(CalculatorTool(), {"expression": "2*3"})[0] == "6"


class HugeReward(BaseTool):
    def default_schema(self) -> dict[str, Any]:
        return {"type": "function", "function": {"name": "huge", "description": "rewards absurdly"}}

    async def execute(self, instance_id: str, parameters: dict[str, Any]) -> tuple[str, Any, dict]:
        return "done", {"int": 10**400, "nan": math.nan}[parameters["kind"]], {}


def test_a_tool_step_reward_that_is_not_a_finite_float_is_a_failed_call():
    """Attack: a tool returning the step reward ``10**400`` (``float()`` raises OverflowError)
    or NaN (poisons the trajectory's reward). Expected: an error message for the model (so no
    step reward is recorded), and the trajectory goes on."""
    text, _, error = call_tool(HugeReward(), {"kind": "int"})
    assert error and text == "Error: tool 'huge' returned a reward too large for a float, not a finite number"
    text, _, error = call_tool(HugeReward(), {"kind": "nan"})
    assert error and text == "Error: tool 'huge' returned the reward nan, not a finite number"


# ---------------------------------------------------------------- 2. weak isolation only when truly asked

WEAK = isolation.Isolation(isolation.RLIMITS, "bubblewrap hidden by the test")


@pytest.fixture
def without_bubblewrap(monkeypatch: pytest.MonkeyPatch) -> None:
    """This machine as if bubblewrap were missing (only process-level isolation)."""
    monkeypatch.setattr(isolation, "detect_isolation", lambda: WEAK)


@pytest.mark.parametrize("value", ["false", "no", "False", "0", 0, 1, None])
def test_allow_weak_isolation_must_be_a_real_boolean(without_bubblewrap, value):
    """Attack: ``allow_weak_isolation: "false"`` (or ``"no"``, ``0``, ...) in a tool config;
    ``bool("false")`` is True, so the old code ran model code without bubblewrap. Expected: a
    ValueError naming the key, before any sandbox exists."""
    with pytest.raises(ValueError, match=r"allow_weak_isolation must be true or false, got "):
        PythonTool(config={"allow_weak_isolation": value})


def test_a_quoted_false_in_tools_yaml_is_a_start_up_error(without_bubblewrap, tmp_path):
    """Attack: the issue's tools.yaml, ``allow_weak_isolation: "false"`` quoted. Expected: the
    start-up error names the file, the entry and the key (and says to unquote)."""
    path = tmp_path / "tools.yaml"
    path.write_text(
        "tools:\n  - class_name: hybridflow.tools.python.PythonTool\n    config:\n"
        '      type: native\n      allow_weak_isolation: "false"\n'
    )
    with pytest.raises(ToolConfigError) as caught:
        load_tool_config(path)
    assert str(caught.value) == (
        f"{path}: tools[0] (hybridflow.tools.python.PythonTool): allow_weak_isolation must be true or false, "
        "got str 'false' (write true or false without quotes)"
    )


def test_yaml_false_without_quotes_refuses_weak_isolation(without_bubblewrap, tmp_path):
    """Control: a real ``false`` (and YAML 1.1's ``no``) keeps the refusal rule: no bubblewrap,
    no tool."""
    for spelling in ("false", "no"):
        path = tmp_path / f"{spelling}.yaml"
        path.write_text(
            "tools:\n  - class_name: hybridflow.tools.python.PythonTool\n    config:\n"
            f"      allow_weak_isolation: {spelling}\n"
        )
        with pytest.raises(isolation.IsolationError, match="runs untrusted code"):
            load_tool_config(path)


def test_weak_isolation_warns_each_time_a_sandbox_is_built(without_bubblewrap, caplog):
    """Attack: none — the opt-in itself. Running model code without bubblewrap needs an explicit
    ``true``, and then every sandbox built for a run (two python tools, one LocalSandbox here)
    says so in the run's output as a warning naming who runs the code and what it can reach."""
    with caplog.at_level(logging.WARNING, logger="hybridflow.sandbox.isolation"):
        PythonTool(config={"allow_weak_isolation": True})
        PythonTool(config={"allow_weak_isolation": True})
        LocalSandbox(SandboxLimits(wall_s=1), allow_weak_isolation=True, what="the code reward")
    messages = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(messages) == 3
    assert messages[0] == messages[1] == (
        "the python tool runs model-written code under WEAK isolation ('rlimits': bubblewrap hidden by the test) "
        "because allow_weak_isolation is true: the code can read what this user can read, open network "
        "connections and write where this user can. Install bubblewrap for the strong sandbox."
    )
    assert messages[2].startswith("the code reward runs model-written code under WEAK isolation")


def test_the_strong_sandbox_does_not_warn(monkeypatch, caplog):
    """Control: with bubblewrap, ``allow_weak_isolation: true`` changes nothing and says nothing."""
    monkeypatch.setattr(isolation, "detect_isolation", lambda: isolation.Isolation(isolation.BWRAP, "test"))
    with caplog.at_level(logging.WARNING, logger="hybridflow.sandbox.isolation"):
        tool = PythonTool(config={"allow_weak_isolation": True})
    assert tool.sandbox.isolation.strong and caplog.records == []


def test_one_strict_rule_for_booleans_from_files():
    """Attack: any boolean read from YAML/JSON with ``bool()``. Expected: the shared parser
    takes real booleans only; the config loader's ``bool`` keys follow the same rule."""
    from hybridflow.config.coerce import CoercionError, coerce
    from hybridflow.utils.booleans import parse_bool

    assert parse_bool(True, "k") is True and parse_bool(False, "k") is False
    for value in ("true", "false", "yes", "", 0, 1, 0.0, None, [False]):
        with pytest.raises(ValueError, match=r"^section\.flag must be true or false, got "):
            parse_bool(value, "section.flag")
        with pytest.raises(CoercionError, match="expected bool"):
            coerce(value, bool)


# ---------------------------------------------------------------- 3. rewards that are not floats


def probe_batch(tokenizer: Any, texts: list[str]) -> DataProto:
    """Responses ``texts`` (one token per byte, right-padded) of the data source ``probe``."""
    ids = [tokenizer.encode(text, add_special_tokens=False) for text in texts]
    width = max(len(x) for x in ids)
    responses = torch.tensor([x + [tokenizer.pad_token_id] * (width - len(x)) for x in ids])
    mask = torch.tensor([[1] * len(x) + [0] * (width - len(x)) for x in ids])
    return DataProto.from_dict(
        tensors={"responses": responses, "response_mask": mask},
        non_tensors={
            "data_source": np.array(["probe"] * len(texts), dtype=object),
            "reward_model": np.array([{"ground_truth": "1"} for _ in texts], dtype=object),
        },
    )


RESULTS: dict[str, Any] = {
    "fine": {"score": 1.0, "acc": 1.0},
    "int": 10**400,
    "dict": {"score": 10**400, "acc": 1.0},
    "extra": {"score": 1.0, "acc": 10**400},
    "giant": 10**5000,  # past Python's 4300-digit limit for turning an int into text
    "nan": math.nan,
    "inf": math.inf,
    "complex": 1j,
    "text": "1.0",
    "tensor": torch.ones(3),
}


def hostile_score(data_source: str, solution_str: str, ground_truth: Any, extra_info: Any = None) -> Any:
    return RESULTS[solution_str]


def test_a_reward_that_cannot_be_a_float_is_counted_like_nan(tokenizer):
    """Attack: a reward function returning ``10**400`` (``float()`` raises OverflowError, which
    killed the trainer), ``{"score": 10**400}``, a huge extra entry, a 5000-digit int, and the
    other non-floats. Expected: the batch completes; each such item scores 0, its
    ``reward_error`` is 1.0 and ``reward/errors`` counts it — exactly as for NaN."""
    names = list(RESULTS)
    manager = RewardManager(tokenizer, compute_score=hostile_score, executor="inline", timeout_s=None)
    reward, info = manager(probe_batch(tokenizer, names))
    assert reward.sum(-1).tolist() == [1.0] + [0.0] * (len(names) - 1)
    assert info["reward_error"] == [0.0] + [1.0] * (len(names) - 1)
    assert info["reward_timeout"] == [0.0] * len(names)
    assert info["acc"] == [1.0] + [None] * (len(names) - 1)
    assert reward_fault_metrics(info) == {"reward/errors": float(len(names) - 1), "reward/timeouts": 0.0}


def batch_hostile_score(data_sources, solution_strs, ground_truths, extra_infos) -> list[Any]:
    return [RESULTS[text] for text in solution_strs]


def test_the_batch_manager_counts_a_huge_reward_like_nan(tokenizer):
    """Attack: the batch form of the same reward function. Expected: the same per-item errors."""
    names = ["fine", "int", "dict", "nan"]
    manager = BatchRewardManager(tokenizer, compute_score=batch_hostile_score, executor="inline", timeout_s=None)
    reward, info = manager(probe_batch(tokenizer, names))
    assert reward.sum(-1).tolist() == [1.0, 0.0, 0.0, 0.0]
    assert info["reward_error"] == [0.0, 1.0, 1.0, 1.0]
    assert reward_fault_metrics(info)["reward/errors"] == 3.0


def test_an_errored_item_counts_zero_in_a_scorer_column_and_a_silent_one_is_named():
    """Attack: a scorer that raises (or returns ``10**400``) on some items while the trainer
    reads one of its dict entries per item (``algorithm.filter_groups.metric``,
    ``algorithm.gdpo_reward_keys``). The errored item has no entries (``None``); it used to stop
    the trainer with ``float(None)``. Now it counts 0.0, as its score does; an item that scored
    but left the entry out is refused with a message naming the key and the item."""
    from hybridflow.reward import REWARD_ERROR, REWARD_TIMEOUT, scored_extra_floats

    info = {"acc": [1.0, None, None, True], REWARD_ERROR: [0.0, 1.0, 0.0, 0.0], REWARD_TIMEOUT: [0.0, 0.0, 1.0, 0.0]}
    assert scored_extra_floats(info, "acc", "filter") == [1.0, 0.0, 0.0, 1.0]
    info[REWARD_TIMEOUT][2] = 0.0  # item 2 scored, yet has no 'acc'
    with pytest.raises(ValueError, match=r"filter: the scorer's 'acc' of item 2 is None, not a number"):
        scored_extra_floats(info, "acc", "filter")
