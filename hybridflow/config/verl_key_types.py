"""The entry types of the verl-key tables: ignored (or accepted while off), moved, renamed.

They live apart from the tables (``verl_compat``, ``verl_keys_new``) so that several table
modules can share them without importing each other.
"""

from __future__ import annotations

from dataclasses import dataclass


def is_off(value: object) -> bool:
    """True for a value that leaves a feature switched off: null, false, empty, or a map of those."""
    if value is None or value is False:
        return True
    if isinstance(value, (list, tuple, str)):
        return len(value) == 0
    if isinstance(value, dict):
        return all(is_off(v) for v in value.values())
    return False


@dataclass(frozen=True)
class IgnoredKey:
    """A verl key hybridflow accepts without using: ignored with a warning, or, with
    ``only_when_off``, accepted only while it leaves its feature switched off."""

    pattern: str
    reason: str
    only_when_off: bool = False  # True: an unsupported feature, accepted only while switched off
    # With only_when_off: further values that mean "off" (e.g. verl's "disabled"), or what
    # hybridflow does anyway (optim.optimizer: AdamW); compared case-insensitively.
    off_values: tuple[object, ...] = ()
    # With only_when_off on a section: the keys that switch it on (the rest are its settings)
    switch_keys: tuple[str, ...] = ()

    def accepts(self, value: object) -> bool:
        """Whether ``value`` may be given: always for an ignored key, only "off" values otherwise."""
        if not self.only_when_off:
            return True
        if isinstance(value, dict):
            keys = [k for k in (self.switch_keys or value) if k in value and k != "_target_"]
            return all(self.accepts(value[k]) for k in keys)
        if isinstance(value, str) and value.lower() in {str(v).lower() for v in self.off_values}:
            return True
        if isinstance(value, bool):  # True == 1: booleans match only booleans
            return any(value is v for v in self.off_values) or is_off(value)
        if isinstance(value, (int, float)) and value in self.off_values:
            return True
        return is_off(value)


@dataclass(frozen=True)
class MovedKey:
    """A verl key (or a whole section) that sets one of ours elsewhere (``old``, ``new``: full
    paths). A section moves leaf by leaf: ``old.x.y`` sets ``new.x.y``."""

    old: str
    new: str


@dataclass(frozen=True)
class RenamedKey:
    pattern: str
    new_name: str  # replaces the last component of the matched key
