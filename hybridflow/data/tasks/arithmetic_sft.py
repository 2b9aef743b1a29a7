"""Built-in task ``arithmetic-sft``: the arithmetic problems with worked answers, for SFT.

Same generator, arguments and seed as ``arithmetic`` — so with equal settings both tasks hold
the same problems and the same held-out test split — plus a ``response`` column with the
worked answer in the format the reward expects::

    "23 + 45 = 68\\n#### 68"

Rows keep every RL column (``prompt`` as chat messages, ``reward_model``, ...), so the SFT
prompts are exactly the prompts the RL run will see.
"""

from __future__ import annotations

import argparse

from hybridflow import fields as F
from hybridflow.data.tasks.arithmetic import TASK as ARITHMETIC_TASK
from hybridflow.data.tasks.common import Rows, TaskSpec

RESPONSE_KEY = "response"


def worked_answer(expression: str, answer: str) -> str:
    """``"23 + 45"``, ``"68"`` → ``"23 + 45 = 68\\n#### 68"``."""
    return f"{expression} = {answer}\n#### {answer}"


def add_responses(rows: Rows) -> Rows:
    """Copies of arithmetic rows with a ``response`` column (from ``extra_info.expression/answer``)."""
    out = []
    for row in rows:
        extra = row[F.EXTRA_INFO]
        out.append({**row, RESPONSE_KEY: worked_answer(extra["expression"], extra["answer"])})
    return out


def _build(args: argparse.Namespace) -> tuple[Rows, Rows]:
    train, test = ARITHMETIC_TASK.build(args)
    return add_responses(train), add_responses(test)


TASK = TaskSpec(
    name="arithmetic-sft",
    help="the arithmetic problems with worked answers ('23 + 45 = 68\\n#### 68') in a response column, for SFT",
    add_arguments=ARITHMETIC_TASK.add_arguments,
    build=_build,
)
