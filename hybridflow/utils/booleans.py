"""Reading a boolean from a config file, a JSON body or a keyword dict: strictly.

``bool(value)`` is the trap: ``bool("false")``, ``bool("no")`` and ``bool("0")`` are all True,
so a quoted ``"false"`` in a YAML file would turn a safety setting *on*. Here only a real
boolean counts — what YAML's ``true``/``false`` (and YAML 1.1's ``yes``/``no``, ``on``/``off``)
and JSON's ``true``/``false`` parse to. Strings of any spelling, numbers (``0``, ``1``) and null
are errors naming the key, never guesses: a string means the value was quoted by mistake, and
guessing what a quoted word meant is how the trap above happens.
"""

from __future__ import annotations

from typing import Any

from hybridflow.utils.errors import short_repr


def parse_bool(value: Any, key: str) -> bool:
    """``value`` when it is a ``bool``; ``ValueError`` naming ``key`` for anything else."""
    if isinstance(value, bool):
        return value
    hint = " (write true or false without quotes)" if isinstance(value, str) else ""
    raise ValueError(f"{key} must be true or false, got {type(value).__name__} {short_repr(value)}{hint}")
