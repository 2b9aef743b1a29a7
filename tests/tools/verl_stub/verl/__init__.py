"""A test-only stand-in for the ``verl`` package: just the two modules a verl tool imports.

Put on ``sys.path`` by the ``verl_imports`` fixture (tests/tools/conftest.py) only when no real
verl is installed, so verl-style tool modules run with their imports unchanged. Written for
hybridflow's tests; it re-exports hybridflow's stand-ins and holds no verl code.
"""
