"""``verl.tools.schemas`` of the test-only stand-in: hybridflow's compatible types."""

from hybridflow.tools.verl_adapter import OpenAIFunctionToolSchema, ToolResponse

__all__ = ["OpenAIFunctionToolSchema", "ToolResponse"]
