"""Built-in tasks behind one registry: ``TASKS.get("arithmetic").build(args)``.

Each task module holds its generator (callable from Python), a :class:`TaskSpec` for the
data CLI and, for the tasks with a scorer of their own (arithmetic, countdown, gsm8k,
tool-lookup), that scorer: ``compute_score(solution_str, ground_truth, extra_info)``. The reward
side (``hybridflow/reward/scorers/``) registers each under the task's ``data_source``; the
code tasks are scored by the generic sandboxed ``hybridflow/reward/scorers/code.py``. Helpers
the scorers share live here too: ``answers.py`` (finding and comparing numbers in model output)
and ``expr.py`` (the one safe arithmetic evaluator, also behind the calculator tool).
"""

from __future__ import annotations

from hybridflow.data.tasks import (
    arithmetic,
    arithmetic_pairs,
    arithmetic_sft,
    code_functions,
    countdown,
    gsm8k,
    shapes,
    tool_lookup,
)
from hybridflow.data.tasks.arithmetic import ArithmeticSettings, generate_arithmetic
from hybridflow.data.tasks.common import TaskSpec, make_row, write_task
from hybridflow.data.tasks.countdown import CountdownSettings, generate_countdown
from hybridflow.data.tasks.gsm8k import convert_gsm8k, convert_gsm8k_rows
from hybridflow.utils.registry import Registry

TASKS: Registry[TaskSpec] = Registry("built-in task")
TASKS.add(arithmetic.TASK.name, arithmetic.TASK)
TASKS.add(arithmetic_sft.TASK.name, arithmetic_sft.TASK)
TASKS.add(arithmetic_pairs.TASK.name, arithmetic_pairs.TASK)
TASKS.add(code_functions.TASK.name, code_functions.TASK)
TASKS.add(code_functions.CONVERT_TASK.name, code_functions.CONVERT_TASK)
TASKS.add(countdown.TASK.name, countdown.TASK)
TASKS.add(gsm8k.TASK.name, gsm8k.TASK)
TASKS.add(shapes.TASK.name, shapes.TASK)
TASKS.add(tool_lookup.TASK.name, tool_lookup.TASK)

__all__ = [
    "TASKS",
    "TaskSpec",
    "ArithmeticSettings",
    "CountdownSettings",
    "convert_gsm8k",
    "convert_gsm8k_rows",
    "generate_arithmetic",
    "generate_countdown",
    "make_row",
    "write_task",
]
