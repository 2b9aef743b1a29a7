"""``verl.tools`` of the test-only stand-in (see ``verl/__init__.py``)."""
