"""Error types of the protocol package that code written for verl can still catch.

verl's ``DataProto`` checks are ``assert`` statements, so verl code catches ``AssertionError``
around ``union``, ``chunk``, ``concat`` and construction. Ours raise errors that name the key
and the numbers; each is *also* an ``AssertionError``, so both kinds of ``except`` work:
``ValueError`` / ``TypeError`` / ``KeyError`` (what the message describes) and
``AssertionError`` (what verl raised).
"""

from __future__ import annotations


class DataProtoError(ValueError, AssertionError):
    """A value-level mismatch: lengths, conflicting keys, sizes that do not divide."""


class DataProtoTypeError(TypeError, AssertionError):
    """A part of the wrong type (e.g. a list where an ndarray belongs)."""


class DataProtoKeyError(KeyError, AssertionError):
    """A key that is not there (``pop`` / ``select`` / ``rename``)."""

    def __str__(self) -> str:  # KeyError would quote the whole message
        return str(self.args[0]) if self.args else ""
