"""A sandbox for untrusted code: model-written programs for code rewards and the Python tool.

``executor.run_code`` runs one program under the strongest isolation the machine has
(``isolation``: bubblewrap namespaces, else process limits only) with the resource caps of
``limits.SandboxLimits``; ``service`` serves it over HTTP in Sandbox Fusion's ``/run_code``
format (``hybridflow sandbox``); ``client`` calls either, the same way. See docs/sandbox.md.
"""
