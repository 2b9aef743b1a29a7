"""Bad input to the tool loop (issue 17, "Bad input") not covered elsewhere: each case gives the
model a clear tool message and the trajectory completes.

Covered elsewhere: a tool that raises and an async tool that hangs
(``test_tool_agent.py::test_tool_errors_go_back_to_the_model_as_tool_messages``), a row whose
``tools_kwargs`` names an unknown tool (``test_tool_agent.py``), a tool config naming a missing
class (``tests/tools/test_registry.py`` and, through ``hybridflow train``, exit 2 in
``tests/test_bad_inputs.py``).
"""

from __future__ import annotations

import sys
import threading
import time

from hybridflow.tools.base import function_tool
from hybridflow.tools.calculator import CalculatorTool

from .test_tool_agent import call, context_segments, run_loop


def test_a_sync_tool_that_hangs_is_abandoned_and_does_not_hold_the_step(smol_tokenizer, scripted, turn_ids):
    tok = smol_tokenizer
    release = threading.Event()

    @function_tool
    def stuck() -> str:
        """Never answers (until the test lets it go)."""
        release.wait(60)
        return "late"

    try:
        start = time.monotonic()
        out = run_loop(tok, scripted([turn_ids(tok, call("stuck", {})), turn_ids(tok, "ok")]), [stuck], tool_timeout_s=0.2)
        elapsed = time.monotonic() - start
    finally:
        release.set()
    # asyncio.run joins its default executor when the loop ends: a hung thread there held the step
    assert elapsed < 5, f"the step waited {elapsed:.1f} s for an abandoned tool thread"
    assert "Error: tool 'stuck' did not finish within 0.2 s" in tok.decode(context_segments(out)[0])
    assert out.response_mask[-1] == 1 and out.num_turns == 4


def test_a_tool_that_exits_is_a_failed_call(smol_tokenizer, scripted, turn_ids):
    tok = smol_tokenizer

    @function_tool
    def quitter() -> str:
        """Calls sys.exit."""
        sys.exit(3)

    out = run_loop(tok, scripted([turn_ids(tok, call("quitter", {})), turn_ids(tok, "ok")]), [quitter])
    assert "Error: tool 'quitter' failed: RuntimeError: SystemExit: 3" in tok.decode(context_segments(out)[0])
    assert out.metrics["tool_errors"] == 1 and out.num_turns == 4


def test_huge_tool_output_is_truncated_to_the_limit(smol_tokenizer, scripted, turn_ids):
    tok = smol_tokenizer

    @function_tool
    def flood() -> str:
        """Ten million characters."""
        return "x" * 5_000_000 + "y" * 5_000_000

    out = run_loop(tok, scripted([turn_ids(tok, call("flood", {})), turn_ids(tok, "ok")]), [flood])
    text = tok.decode(context_segments(out)[0])
    # the default: 256 characters kept, both ends (middle truncation)
    assert "x" * 128 + "...(truncated)..." + "y" * 128 + "<|im_end|>" in text
    assert len(text) < 600 and out.response_mask[-1] == 1


def test_a_thousand_tool_calls_in_one_turn(smol_tokenizer, scripted, turn_ids):
    tok = smol_tokenizer
    calculator = CalculatorTool()
    runs = []
    real_execute = calculator.execute

    async def counting_execute(instance_id, parameters):
        runs.append(parameters)
        return await real_execute(instance_id, parameters)

    calculator.execute = counting_execute
    turn1 = turn_ids(tok, "".join(call("calculator", {"expression": f"{i}+1"}) for i in range(1000)))
    start = time.monotonic()
    out = run_loop(
        tok, scripted([turn1, turn_ids(tok, "done")]), [calculator], response_length=len(turn1) + 400,
        max_parallel_calls=2,
    )
    assert time.monotonic() - start < 10
    assert runs == [{"expression": "0+1"}, {"expression": "1+1"}]  # only the first max_parallel_calls run
    text = tok.decode(context_segments(out)[0])
    assert "Error: at most 2 tool call(s) run per turn; the other 998 were skipped" in text
    assert text.count("<|im_start|>tool\n") == 3  # two results and one note, not 1,000 messages
    assert out.tool_call_counts == 2 and out.num_turns == 4 and out.response_mask[-1] == 1
