"""``calc_gsm8k_reward(answer)``: the model submits a GSM8K answer and reads its score.

The built-in that verl's ``verl.tools.gsm8k_tool.Gsm8kTool`` class path maps to when verl is
not installed (:mod:`hybridflow.tools.verl_adapter`). It behaves as verl's tool does: the
answer is scored against the row's ``ground_truth`` (a ``create_kwargs`` entry) with the
``openai/gsm8k`` scorer's flexible extraction (the last number), the model reads
``Current parsed answer='…' reward=…``, and the step reward is 0.0 when the submission beats
the trajectory's best so far, else -0.05 (a penalty for resubmitting without improving).
"""

from __future__ import annotations

from typing import Any

from hybridflow.data.tasks import gsm8k
from hybridflow.tools.base import BaseTool, ToolOutput, one_string_param_schema

NO_IMPROVEMENT_PENALTY = -0.05


class Gsm8kAnswerTool(BaseTool):
    """See the module docstring. Config keys: ``type`` only."""

    def __init__(self, config: dict[str, Any] | None = None, tool_schema: dict[str, Any] | None = None) -> None:
        super().__init__(config, tool_schema)
        unknown = sorted(set(self.config) - {"type"})
        if unknown:
            raise ValueError(f"unknown config key(s) {unknown} of the gsm8k tool; valid: type")
        self._state: dict[str, dict[str, Any]] = {}

    def default_schema(self) -> dict[str, Any]:
        return one_string_param_schema(
            "calc_gsm8k_reward",
            "Score an answer to the GSM8K problem (1.0 if correct, else 0.0).",
            "answer",
            "the final answer, a number",
        )

    async def create(self, instance_id: str, **kwargs: Any) -> None:
        ground_truth = kwargs.get("ground_truth", (kwargs.get("create_kwargs") or {}).get("ground_truth"))
        self._state[instance_id] = {"ground_truth": ground_truth, "reward": 0.0}

    async def execute(self, instance_id: str, parameters: dict[str, Any]) -> ToolOutput:
        state = self._state[instance_id]
        answer = str(parameters.get("answer", ""))
        reward = await self.calc_reward(instance_id, answer=answer)
        step_reward = 0.0 if reward > state["reward"] else NO_IMPROVEMENT_PENALTY
        state["reward"] = reward
        return f"Current parsed {answer=} {reward=}", step_reward, {}

    async def calc_reward(self, instance_id: str, answer: str = "", **_: Any) -> float:
        """The score of ``answer`` (0.0 when the row gave no ground truth)."""
        ground_truth = self._state[instance_id]["ground_truth"]
        if ground_truth is None:
            return 0.0
        submitted = answer if answer.startswith("#### ") else f"#### {answer}"
        result = gsm8k.compute_score(submitted, ground_truth, method="flexible", format_score=0.0, score=1.0)
        return float(result["score"])

    async def release(self, instance_id: str) -> None:
        self._state.pop(instance_id, None)
