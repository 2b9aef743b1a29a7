"""Agent loops: multi-turn rollouts in token ids, with tool calls.

``base.py`` (AgentLoopBase, AgentLoopOutput, the loop table and verl's loop YAML),
``single_turn.py`` (``single_turn_agent``), ``tool_agent.py`` (``tool_agent``),
``tokens.py`` (incremental rendering, separators), ``parsers/`` (tool-call formats),
``collate.py`` (trajectories → DataProto), ``runner.py`` (a batch through its loops).
Importing the package registers the built-in loops.
"""

from hybridflow.agent import single_turn, tool_agent
from hybridflow.agent.base import AGENT_LOOPS, AgentContext, AgentLoopBase, AgentLoopOutput, AgentLoopSpec

__all__ = [
    "AGENT_LOOPS",
    "AgentContext",
    "AgentLoopBase",
    "AgentLoopOutput",
    "AgentLoopSpec",
    "single_turn",
    "tool_agent",
]
