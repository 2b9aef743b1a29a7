"""Tools for agent loops: the interface, the YAML/function-file registry, built-in tools.

``base.py`` (BaseTool, ``@function_tool``, schemas), ``calls.py`` (one trajectory's calls:
instances, timeouts, error texts, truncation), ``tool_loop.py`` (the event loop tool code runs
on, so a timeout holds even for a tool that blocks), ``registry.py`` (verl's tool YAML and
function-tool files), ``verl_adapter.py`` (verl's tool classes, run unchanged),
``calculator.py``, ``python.py``, ``gsm8k.py`` and ``sandbox_fusion.py`` (built-in tools).
"""
