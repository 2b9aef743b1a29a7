"""The command-line entry points, one thin recipe per ``hybridflow`` subcommand.

Each module has a ``main(argv)`` and runs as ``python -m hybridflow.entrypoints.<name>``;
``hybridflow <command>`` (:mod:`hybridflow.cli`) forwards to it. What several recipes share is in
:mod:`hybridflow.entrypoints.common`; no entry point imports another. This package imports
nothing on purpose: ``python -m hybridflow.entrypoints.sandbox`` stays as light as the sandbox.
"""
