"""``verl.tools.base_tool.BaseTool`` of the test-only stand-in: hybridflow's VerlBaseTool."""

from hybridflow.tools.verl_adapter import VerlBaseTool as BaseTool

__all__ = ["BaseTool"]
